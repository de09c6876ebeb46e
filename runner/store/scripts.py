"""Lua scripts of the Redis store, one named constant each.

Each has its KEYS/ARGV header (after the shared Lua functions it uses) and touches only
the keys it declares: one run's keys and its shard's index entries, all in one Redis
Cluster slot (see :mod:`runner.store.keys`). They are registered once per client
(``register_script``) and run by EVALSHA.
"""

_STATE = """
-- A checkpoint's state is stored by field: 'values' holds each field value once per
-- version ('<seq>:<field>' -> JSON, seq being the commit that wrote it) and 'refs' each
-- checkpoint's field list with the version of each ('[[names], [versions]]').

-- The field -> version map of checkpoint `cid` (false when it has none: an older layout).
local refs_cache = {}
local function refs_of(refs, cid)
  local cached = refs_cache[cid]
  if cached == nil then
    cached = false
    local raw = redis.call('HGET', refs, cid)
    if raw then
      local pair = cjson.decode(raw)
      cached = {}
      for j, name in ipairs(pair[1]) do cached[name] = pair[2][j] end
    end
    refs_cache[cid] = cached
  end
  return cached
end

-- The values of a '[[names], [versions]]' list, in its order.
local function values_of(values, raw)
  local pair = cjson.decode(raw)
  local out = {}
  for j = 1, #pair[1], 1000 do
    local keys = {}
    for m = j, math.min(j + 999, #pair[1]) do keys[#keys + 1] = pair[2][m] .. ':' .. pair[1][m] end
    for _, value in ipairs(redis.call('HMGET', values, unpack(keys))) do out[#out + 1] = value end
  end
  return out
end
"""

_FORGET_CHECKPOINT = (
    _STATE
    + """
-- Remove a pruned checkpoint: its snapshot, history entry and lookup entry; the field
-- values no kept checkpoint refers to any more; and its activation's bookkeeping: the
-- attempts entry (fencing of the activation's late attempts; once the checkpoint is gone
-- the run's record fences them, since an activation no longer pending is never committed
-- again) and its dispatch marker.
-- k: {history, snapshots, checkpoint lookup, acts, attempts, markers, refs, values}
local function forget_checkpoint(k, id)
  redis.call('HDEL', k[2], id)
  redis.call('ZREM', k[1], id)
  redis.call('HDEL', k[3], id)
  local own = refs_of(k[7], id)
  redis.call('HDEL', k[7], id)
  if own then
    -- A field's versions only grow along the history, so the oldest kept checkpoint from
    -- the version on is the only one that can still refer to it (found once per version).
    local oldest = {}
    for name, version in pairs(own) do
      local refs = oldest[version]
      if refs == nil then
        local after = redis.call('ZRANGEBYSCORE', k[1], version, '+inf', 'LIMIT', 0, 1)
        refs = #after > 0 and refs_of(k[7], after[1])
        oldest[version] = refs
      end
      if not (refs and refs[name] == version) then
        redis.call('HDEL', k[8], version .. ':' .. name)
      end
    end
  end
  local activation = redis.call('HGET', k[4], id)
  if not activation then return end
  redis.call('HDEL', k[4], id)
  local entry = redis.call('HGET', k[5], activation)
  if entry and string.sub(entry, -(#id + 1)) == '|' .. id then
    redis.call('HDEL', k[5], activation)
    redis.call('HDEL', k[6], activation)
  end
end

-- The oldest checkpoints beyond the newest `keep`, sparing the pinned ones (fork points).
local function prunable(history, pins, keep)
  local extra = redis.call('ZCARD', history) - keep
  local found = {}
  if extra <= 0 then return found end
  for _, old in ipairs(redis.call('ZRANGE', history, 0, extra - 1)) do
    if redis.call('SISMEMBER', pins, old) == 0 then found[#found + 1] = old end
  end
  return found
end
"""
)

_LEASE = """
-- A soft lease (token '~...': a sender's until the broker has the message, a receiving
-- worker's until an attempt begins) gives way at once to an attempt (a token without '~'),
-- and a sender's to a receiving worker's; any other live lease answers for the step.
local function yields(holder, caller)
  if string.sub(holder, 1, 1) ~= '~' then return false end
  if string.sub(caller, 1, 1) ~= '~' then return true end
  return string.sub(holder, 1, 6) == '~send:' and string.sub(caller, 1, 6) == '~recv:'
end

-- Take activation `key`'s lease for `token` until `expiry`, unless it was committed
-- ('done') or a live lease that does not give way answers for it ('held', its holder).
local function take_lease(attempts, leases, owners, key, token, expiry, now)
  if redis.call('HEXISTS', attempts, key) == 1 then return 'done', false end
  local owner = redis.call('HGET', owners, key)
  local until_ = redis.call('ZSCORE', leases, key)
  if owner and owner ~= token and until_ and tonumber(until_) > tonumber(now)
      and not yields(owner, token) then
    return 'held', owner
  end
  redis.call('ZADD', leases, expiry, key)
  redis.call('HSET', owners, key, token)
  return 'ok', false
end
"""

COMMIT = (
    _FORGET_CHECKPOINT
    + _LEASE
    + """
-- Commit a checkpoint (and the run's closing one after it): idempotent per activation,
-- gapless sequence, pruning.
-- KEYS[1] meta hash        KEYS[2] history zset      KEYS[3] snapshots hash
-- KEYS[4] attempts hash    KEYS[5] acts hash         KEYS[6] pins set
-- KEYS[7] leases zset      KEYS[8] lease owners hash KEYS[9] dispatch markers hash
-- KEYS[10] run index (shard)  KEYS[11] checkpoint lookup (shard)  KEYS[12] active runs (shard)
-- KEYS[13] field values hash   KEYS[14] refs hash
-- KEYS[15] finished runs whose expiry is undecided (shard): a run that ends joins it
-- KEYS[16...] the keys the outbox commands write (below), in order
-- ARGV[1] the request, JSON:
--   id, run, status, epoch    the checkpoint's id, run id, run status and epoch (a string)
--   activation, attempt       its activation ('' = none) and the attempt's token
--   expected                  the run's seq the commit follows ('' = any)
--   keep                      checkpoints kept (0 = all)
--   now                       unix seconds (a string)
--   always, once              meta field pairs [k, v, ...] set by every commit / a new run's
--   dispatching               activations the caller sends next (marked sent now)
--   base                      the checkpoint the state is a change of ('' = the whole state)
--   names, versions           the state's field names and their versions (JSON array texts;
--                             -1 = written by this commit; names '' = the state is inside
--                             the snapshot)
--   changed                   the fields written now (their values follow in ARGV)
--   sender, sender_until      the sender's soft-lease token ('' = none) and its expiry: each
--                             dispatching activation gets it by take_lease's rule (a sender
--                             dying before it sends leaves leases that lapse)
--   outbox                    [command, key or channel] run once the commit is written: the
--                             ready steps' messages published in the same atomic write
--                             ('lpush'/'pexpire' a key, the next of KEYS[16...]; 'publish')
--   closing                   '' or {id, always}: the run's closing checkpoint, next in seq
--   carried                   activation keys whose lease, owner and marker outlive a new
--                             epoch (steps still running when a paused or failed run went on)
--   released                  [activation key, token]: that lease dropped if the token holds
--                             it (an attempt that paused or slept: ended, the step in flight)
-- ARGV[2] snapshot JSON without its opening '{', without seq (and state, when by field)
-- ARGV[3] the closing checkpoint's snapshot, likewise ('' = none)
-- ARGV[4...] the changed fields' values (JSON), then the outbox commands' values
-- Returns {'ok', seq} | {'dup', checkpoint id} | {'stale', checkpoint id}
--       | {'conflict', current seq} | {'rebase', latest id} (the change's base is not the
--       latest checkpoint: send the whole state)
local h = cjson.decode(ARGV[1])
local activation = h.activation
if activation ~= '' then
  local prev = redis.call('HGET', KEYS[4], activation)
  if prev then
    local sep = string.find(prev, '|', 1, true)
    local cid = string.sub(prev, sep + 1)
    if string.sub(prev, 1, sep - 1) == h.attempt then return {'dup', cid} end
    return {'stale', cid}
  end
end
local cur = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if h.expected ~= '' and tonumber(h.expected) ~= cur then return {'conflict', tostring(cur)} end
if h.base ~= '' then
  local latest = redis.call('HGET', KEYS[1], 'latest')
  if latest ~= h.base then return {'rebase', latest or ''} end
end
local seq = cur + 1
local now, run, status = h.now, h.run, h.status
local refs = false
if h.names ~= '' then
  refs = '[' .. h.names .. ',' .. (string.gsub(h.versions, '%-1', tostring(seq))) .. ']'
end
-- A snapshot at `at`, in the history, the lookup and (by field) with its field list.
local function write(at, id, body)
  redis.call('HSET', KEYS[3], id, '{"seq":' .. at .. ',' .. body)
  redis.call('ZADD', KEYS[2], at, id)
  redis.call('HSET', KEYS[11], id, run)
  if refs then redis.call('HSET', KEYS[14], id, refs) end
end
write(seq, h.id, ARGV[2])
if activation ~= '' then
  redis.call('HSET', KEYS[4], activation, h.attempt .. '|' .. h.id)
  redis.call('HSET', KEYS[5], h.id, activation)
  if h.attempt ~= '' then
    -- A committed step needs no lease; dropping it here leaves none behind if the
    -- committer dies right after the commit. (In-process steps have no token, no lease.)
    redis.call('ZREM', KEYS[7], activation)
    redis.call('HDEL', KEYS[8], activation)
  end
end
local released = h.released
if released[1] ~= '' and redis.call('HGET', KEYS[8], released[1]) == released[2] then
  redis.call('ZREM', KEYS[7], released[1])
  redis.call('HDEL', KEYS[8], released[1])
end
-- Markers and leases serve a run in one epoch: a run that ends, or a resume into a new
-- epoch, leaves none behind (old-epoch messages and attempts are skipped, and a resume
-- dispatches every pending step again), except those of the steps carried on (still
-- running when a paused or failed run went on). A pause keeps them: its epoch's steps may
-- still run. So does a failure, for the steps whose lease is live: a parallel branch runs
-- on, and a resume of the failed run carries it rather than run its method again.
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if (status ~= 'running' and status ~= 'paused') or (epoch and epoch ~= h.epoch) then
  local keys = h.carried or {}
  if status == 'failed' and not (epoch and epoch ~= h.epoch) then
    for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '(' .. now, '+inf')) do
      keys[#keys + 1] = key
    end
  end
  local kept = {}
  for i, key in ipairs(keys) do
    kept[i] = {redis.call('ZSCORE', KEYS[7], key), redis.call('HGET', KEYS[8], key),
               redis.call('HGET', KEYS[9], key)}
  end
  redis.call('DEL', KEYS[7], KEYS[8], KEYS[9])
  for i, key in ipairs(keys) do
    if kept[i][1] then redis.call('ZADD', KEYS[7], kept[i][1], key) end
    if kept[i][2] then redis.call('HSET', KEYS[8], key, kept[i][2]) end
    if kept[i][3] then redis.call('HSET', KEYS[9], key, kept[i][3]) end
  end
end
local fields = {'seq', seq, 'latest', h.id, 'updated_at', now, 'status', status, 'epoch', h.epoch}
for _, item in ipairs(h.always) do fields[#fields + 1] = item end
redis.call('HSET', KEYS[1], unpack(fields))
if cur == 0 then
  redis.call('HSETNX', KEYS[1], 'created_at', now)
  redis.call('HSETNX', KEYS[1], 'run_id', run)
  for j = 1, #h.once, 2 do redis.call('HSETNX', KEYS[1], h.once[j], h.once[j + 1]) end
end
for _, key in ipairs(h.dispatching) do
  redis.call('HSETNX', KEYS[9], key, now)
  if h.sender ~= '' and status == 'running' then
    take_lease(KEYS[4], KEYS[7], KEYS[8], key, h.sender, h.sender_until, now)
  end
end
-- The state: changed fields written at this seq (the field list is in the snapshot's refs).
for j, name in ipairs(h.changed) do
  redis.call('HSET', KEYS[13], seq .. ':' .. name, ARGV[3 + j])
end
local value, key_of = 3 + #h.changed, 15
for _, command in ipairs(h.outbox) do
  value = value + 1
  if command[1] == 'publish' then
    redis.call('PUBLISH', command[2], ARGV[value])
  else
    key_of = key_of + 1
    redis.call(command[1], KEYS[key_of], ARGV[value])
  end
end
local last = seq
if h.closing ~= '' then
  -- The run ended: its closing checkpoint follows, with the same state.
  last = seq + 1
  write(last, h.closing.id, ARGV[3])
  local closing = {'seq', last, 'latest', h.closing.id}
  for _, item in ipairs(h.closing.always) do closing[#closing + 1] = item end
  redis.call('HSET', KEYS[1], unpack(closing))
end
redis.call('ZADD', KEYS[10], now, run)
if status == 'running' then
  redis.call('ZADD', KEYS[12], now, run)
else
  redis.call('ZREM', KEYS[12], run)
end
-- Retention counts from the run's end; the recovery pass decides when it expires.
if status == 'succeeded' or status == 'failed' or status == 'cancelled' then
  redis.call('ZADD', KEYS[15], now, run)
else
  redis.call('ZREM', KEYS[15], run)
end
if h.keep > 0 and last > h.keep then
  local k = {KEYS[2], KEYS[3], KEYS[11], KEYS[5], KEYS[4], KEYS[9], KEYS[14], KEYS[13]}
  for _, old in ipairs(prunable(KEYS[2], KEYS[6], h.keep)) do forget_checkpoint(k, old) end
end
return {'ok', tostring(seq)}
"""
)

PRUNE = (
    _FORGET_CHECKPOINT
    + """
-- Delete all but the newest ARGV[1] checkpoints of a run, sparing pinned ones.
-- KEYS[1] history zset   KEYS[2] snapshots hash   KEYS[3] checkpoint lookup (shard)
-- KEYS[4] acts hash      KEYS[5] attempts hash    KEYS[6] dispatch markers hash
-- KEYS[7] refs hash      KEYS[8] field values hash   KEYS[9] pins set
-- ARGV[1] keep           ARGV[2] '1' = dry run
-- Returns the ids deleted (or that would be).
local gone = prunable(KEYS[1], KEYS[9], tonumber(ARGV[1]))
if ARGV[2] ~= '1' then
  for _, old in ipairs(gone) do forget_checkpoint(KEYS, old) end
end
return gone
"""
)

UPDATE_RUN = """
-- Set fields of an existing run's metadata and touch the run index.
-- KEYS[1] meta hash   KEYS[2] run index (shard)   KEYS[3] active runs (shard)
-- KEYS[4] finished runs whose expiry is undecided (shard)
-- ARGV[1] run id      ARGV[2] now   ARGV[3] fields JSON
-- Returns 0 when the run does not exist, else 1.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local fields = {'updated_at', ARGV[2]}
local given = cjson.decode(ARGV[3])
for k, v in pairs(given) do
  fields[#fields + 1] = k
  fields[#fields + 1] = v
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'running' then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
else
  redis.call('ZREM', KEYS[3], ARGV[1])
end
if given.status then
  if status == 'succeeded' or status == 'failed' or status == 'cancelled' then
    redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
  else
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
end
return 1
"""

DELETE_RUN = """
-- Remove a run: every per-run key and its index entries.
-- KEYS[1] meta hash   KEYS[2] history zset   KEYS[3] run index (shard)
-- KEYS[4] checkpoint lookup (shard)   KEYS[5] active runs (shard)
-- KEYS[6] finished runs undecided (shard)   KEYS[7] expiry index (shard)
-- KEYS[8..] the run's other keys (deleted whole)
-- ARGV[1] run id
-- Returns 1 when the run existed, else 0.
local existed = redis.call('EXISTS', KEYS[1])
local ids = redis.call('ZRANGE', KEYS[2], 0, -1)
for j = 1, #ids, 1000 do
  redis.call('HDEL', KEYS[4], unpack(ids, j, math.min(j + 999, #ids)))
end
for j = 3, 7 do
  if j ~= 4 then redis.call('ZREM', KEYS[j], ARGV[1]) end
end
redis.call('DEL', KEYS[1], KEYS[2], unpack(KEYS, 8))
return existed
"""

RELEASE = """
-- Drop an activation's lease if the caller still holds it.
-- KEYS[1] leases zset   KEYS[2] lease owners hash
-- ARGV[1] activation    ARGV[2] attempt token
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
"""

ADMIT = """
-- Admit a step under every limit it counts against, in one call: each rate limit (GCRA:
-- a start is allowed while the theoretical arrival time is at most burst-1 intervals
-- ahead) and each concurrency limit (slots: attempt tokens scored by lease expiry, the
-- lapsed ones trimmed first, so a killed worker's slot comes back with its lease).
-- A step over a rate reserves its turn: the rate advances and the step is noted in the
-- limit's waiting set, scored by its turn; back at its turn it passes that limit without
-- advancing it again (so deferred steps come back one at a time, not all at once). A second
-- GCRA clock counts the starts themselves: a reserved turn is a plan, and steps that come
-- back late together (a killed worker's deferred messages, restored at once) would start
-- together; the starts clock holds them to the burst, then one an interval, each keeping
-- its reservation and moved to when the starts allow it. A step that finds the slots taken
-- is noted there to poll again. Admitted, it takes its slots, advances the rates it had not
-- reserved and every starts clock, and leaves the waiting sets.
-- Limits are named "rate:<name>" or "concurrency:<name>".
-- KEYS[1] limited zset (limit -> last used)   KEYS[2..1+R] rate keys
-- KEYS[2+R..1+R+C] slot zsets                 KEYS[2+R+C..1+2R+2C] waiting zsets (rates, slots)
-- KEYS[2+2R+2C..1+3R+2C] rates' starts clocks
-- KEYS[#KEYS] limit-specs hash (limit -> its spec record, see runner.store.limits)
-- ARGV[1] JSON {token, member, lease_ms, poll_ms, rates: [[interval_ms, burst, name, spec]],
--               slots: [[count, name, spec]]}
-- Returns {1, 0, ''} (admitted) or {0, wait_ms, name of the limit that holds it longest}.
local h = cjson.decode(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local R, C = #h.rates, #h.slots
-- A GCRA clock is kept until a second after the time it holds: then it is 'now' again.
local function set_clock(key, at)
  redis.call('SET', key, at, 'PX', math.ceil(at - now) + 1000)
end
local wait, holder, fresh, started = 0, '', {}, {}
for i = 1, R do
  local interval, burst, name = h.rates[i][1], h.rates[i][2], h.rates[i][3]
  local waiting = KEYS[1 + R + C + i]
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now - 60000)
  redis.call('HSET', KEYS[#KEYS], name, h.rates[i][4])
  redis.call('ZADD', KEYS[1], now, name)
  started[i] = math.max(tonumber(redis.call('GET', KEYS[1 + 2 * R + 2 * C + i]) or '0'), now)
  local early = started[i] - now - (burst - 1) * interval
  local turn = redis.call('ZSCORE', waiting, h.member)
  local over = 0
  if turn then
    over = tonumber(turn) - now
    if over <= 0 and early > 0 then
      over = early
      redis.call('ZADD', waiting, now + over, h.member)
    end
  else
    local tat = math.max(tonumber(redis.call('GET', KEYS[1 + i]) or '0'), now)
    over = math.max(tat - now - (burst - 1) * interval, early)
    if over > 0 then
      set_clock(KEYS[1 + i], tat + interval)
      redis.call('ZADD', waiting, now + over, h.member)
    else
      fresh[i] = tat
    end
  end
  if over > wait then wait, holder = over, name end
end
for j = 1, C do
  local key, name = KEYS[1 + R + j], h.slots[j][2]
  local waiting = KEYS[1 + 2 * R + C + j]
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now - 60000)
  redis.call('HSET', KEYS[#KEYS], name, h.slots[j][3])
  redis.call('ZADD', KEYS[1], now, name)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local full = not redis.call('ZSCORE', key, h.token) and redis.call('ZCARD', key) >= h.slots[j][1]
  if full then
    redis.call('ZADD', waiting, now + h.poll_ms, h.member)
    if wait < h.poll_ms then wait, holder = h.poll_ms, name end
  end
end
if wait > 0 then return {0, math.ceil(wait), holder} end
for i = 1, R do
  if fresh[i] then set_clock(KEYS[1 + i], fresh[i] + h.rates[i][1]) end
  set_clock(KEYS[1 + 2 * R + 2 * C + i], started[i] + h.rates[i][1])
  redis.call('ZREM', KEYS[1 + R + C + i], h.member)
end
for j = 1, C do
  local key = KEYS[1 + R + j]
  redis.call('ZADD', key, now + h.lease_ms, h.token)
  redis.call('PEXPIRE', key, 2 * h.lease_ms + 1000)
  redis.call('ZREM', KEYS[1 + 2 * R + C + j], h.member)
end
return {1, 0, ''}
"""

RENEW_SLOTS = """
-- Renew the concurrency slots a process's running attempts hold (a lapsed one stays gone).
-- KEYS[1..N] slot zsets   ARGV[1] lease in ms   ARGV[2..N+1] the token held in each
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + lease, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], 2 * lease + 1000)
end
return #KEYS
"""

BEGIN_STEP = (
    _STATE
    + _LEASE
    + """
-- Read a run's latest checkpoint and, unless the activation was committed, take its lease.
-- KEYS[1] history zset   KEYS[2] snapshots hash   KEYS[3] attempts hash
-- KEYS[4] leases zset    KEYS[5] lease owners hash   KEYS[6] refs hash   KEYS[7] values hash
-- ARGV[1] activation ('' = read only)   ARGV[2] attempt token
-- ARGV[3] lease expiry                  ARGV[4] now
-- Returns {snapshot JSON | nil, outcome, holder | nil, refs | nil, state values...};
-- outcome 'none' (no run), 'read' (read only), 'done' (committed), 'held' (a live lease of
-- the attempt ``holder``) or 'ok' (the caller's lease); refs and the values in their order
-- are the state (no refs: the snapshot holds its state, an older layout).
local ids = redis.call('ZREVRANGE', KEYS[1], 0, 0)
if #ids == 0 then return {false, 'none'} end
local blob = redis.call('HGET', KEYS[2], ids[1])
local function reply(outcome, holder)
  local refs = redis.call('HGET', KEYS[6], ids[1])
  local out = {blob, outcome, holder, refs}
  if refs then
    for _, value in ipairs(values_of(KEYS[7], refs)) do out[#out + 1] = value end
  end
  return out
end
if ARGV[1] == '' then return reply('read', false) end
return reply(take_lease(KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3], ARGV[4]))
"""
)

CLAIM = (
    _LEASE
    + """
-- Take soft leases without reading the run (a sender before it marks steps sent, a worker
-- that received a step's message): BEGIN_STEP's rule for each activation.
-- KEYS[1] history zset   KEYS[2] attempts hash   KEYS[3] leases zset   KEYS[4] owners hash
-- ARGV[1] token   ARGV[2] lease expiry   ARGV[3] now   ARGV[4..] activations
-- Returns {'none'} when there is no such run, else each activation's outcome in order.
if redis.call('EXISTS', KEYS[1]) == 0 then return {'none'} end
local out = {}
for j = 4, #ARGV do
  out[#out + 1] = (take_lease(KEYS[2], KEYS[3], KEYS[4], ARGV[j], ARGV[1], ARGV[2], ARGV[3]))
end
return out
"""
)

RENEW = """
-- Extend a lease the caller still holds (a heartbeat); never re-creates a dropped one.
-- KEYS[1] leases zset   KEYS[2] lease owners hash
-- ARGV[1] activation    ARGV[2] attempt token   ARGV[3] new expiry
-- Returns 1 when renewed, 0 when the lease is gone or another attempt's.
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""

TAKE_OVER = """
-- Take the lease of an attempt known to be dead (its process is gone) before it expires.
-- KEYS[1] leases zset   KEYS[2] lease owners hash
-- ARGV[1] activation    ARGV[2] dead attempt's token   ARGV[3] new token   ARGV[4] expiry
-- Returns 1 when taken, 0 when the lease changed hands (or was dropped by a commit).
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

UPGRADE_RUN = """
-- Move snapshots written by an earlier version (one string key each) into the run's
-- snapshots hash.
-- KEYS[1] snapshots hash   KEYS[2..] old snapshot string keys
-- ARGV[1..] the checkpoint ids of KEYS[2..]
-- Returns how many snapshots were moved.
local moved = 0
for j = 2, #KEYS do
  local blob = redis.call('GET', KEYS[j])
  if blob then
    redis.call('HSET', KEYS[1], ARGV[j - 1], blob)
    redis.call('DEL', KEYS[j])
    moved = moved + 1
  end
end
return moved
"""

TIMER_DONE = """
-- KEYS[1]: a timer sorted set (run id -> when to act). ARGV[1]: the run id, ARGV[2]: now.
-- Drop the run's timer only if it is not later than now: a later one set since stays.
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""

_EXPIRING = """
local function expiring(status)
  return status == 'succeeded' or status == 'failed' or status == 'cancelled'
end
"""

DECIDE_EXPIRY = (
    _EXPIRING
    + """
-- Move a finished run from the undecided index to the expiry index (the retention pass
-- decided when it expires), unless it ended again or was resumed since it was read.
-- KEYS[1] finished runs undecided (shard)   KEYS[2] expiry index (shard)   KEYS[3] meta hash
-- ARGV[1] run id   ARGV[2] its end time as read from KEYS[1]   ARGV[3] when it expires
--         (unix seconds, or 'inf': kept)
-- Returns 1 decided, 2 pinned (kept, in neither index), 0 changed since it was read.
local ended = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ended or tonumber(ended) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if not expiring(redis.call('HGET', KEYS[3], 'status')) then return 0 end
redis.call('HSET', KEYS[3], 'ended_at', ARGV[2])
if redis.call('HGET', KEYS[3], 'pinned') then return 2 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
"""
)

EXPIRE_RUN = (
    _EXPIRING
    + """
-- Delete an expired run from Redis (after its archive copy, if any, was confirmed): every
-- per-run key and its index entries, only if it still is what the caller archived.
-- KEYS[1] meta hash   KEYS[2] history zset   KEYS[3] run index (shard)
-- KEYS[4] checkpoint lookup (shard)   KEYS[5] active runs (shard)
-- KEYS[6] finished runs undecided (shard)   KEYS[7] expiry index (shard)
-- KEYS[8..] the run's other keys (unlinked whole)
-- ARGV[1] run id   ARGV[2] now   ARGV[3] the seq the archive holds ('' = no archive)
-- Returns 'gone' deleted | 'early' not due | 'changed' committed since it was archived
--       | 'live' resumed, pinned or gone (dropped from the expiry index)
--       | 'undecided' ended again since (its expiry is decided anew)
local run = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'pinned')
   or not expiring(redis.call('HGET', KEYS[1], 'status')) then
  redis.call('ZREM', KEYS[7], run)
  return 'live'
end
if redis.call('ZSCORE', KEYS[6], run) then
  redis.call('ZREM', KEYS[7], run)
  return 'undecided'
end
local at = redis.call('ZSCORE', KEYS[7], run)
if not at or tonumber(at) > tonumber(ARGV[2]) then return 'early' end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'seq') ~= ARGV[3] then return 'changed' end
local ids = redis.call('ZRANGE', KEYS[2], 0, -1)
for j = 1, #ids, 1000 do
  redis.call('HDEL', KEYS[4], unpack(ids, j, math.min(j + 999, #ids)))
end
redis.call('ZREM', KEYS[3], run)
redis.call('ZREM', KEYS[5], run)
redis.call('ZREM', KEYS[7], run)
-- UNLINK: the snapshots' memory is freed off the main thread.
redis.call('UNLINK', KEYS[1], KEYS[2], unpack(KEYS, 8))
return 'gone'
"""
)

PIN_RUN = (
    _EXPIRING
    + """
-- Keep a run for ever (pin) or let its retention apply again (unpin).
-- KEYS[1] meta hash   KEYS[2] finished runs undecided (shard)   KEYS[3] expiry index (shard)
-- ARGV[1] run id   ARGV[2] '1' pin, '0' unpin
-- Returns 0 when the run does not exist, else 1.
local run = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[2] == '1' then
  local ended = redis.call('ZSCORE', KEYS[2], run)
  if ended then redis.call('HSET', KEYS[1], 'ended_at', ended) end
  redis.call('HSET', KEYS[1], 'pinned', '1')
  redis.call('ZREM', KEYS[2], run)
  redis.call('ZREM', KEYS[3], run)
  return 1
end
redis.call('HDEL', KEYS[1], 'pinned')
if expiring(redis.call('HGET', KEYS[1], 'status')) then
  -- Decided anew from its end (the pass reads the flow's policy then).
  local ended = redis.call('HGET', KEYS[1], 'ended_at') or redis.call('HGET', KEYS[1], 'updated_at')
  redis.call('ZADD', KEYS[2], ended, run)
end
return 1
"""
)

REPLACE_SAME = """
-- Replace hash fields still holding the value read (``runner rekey``'s compare-and-set: a
-- field pruned or rewritten since it was read is left as it is now).
-- KEYS[1] a hash   ARGV[1..] triples: field, value read, new value
-- Returns how many fields were replaced.
local n = 0
for j = 1, #ARGV, 3 do
  if redis.call('HGET', KEYS[1], ARGV[j]) == ARGV[j + 1] then
    redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 2])
    n = n + 1
  end
end
return n
"""
