"""Lua scripts of the Redis store, one named constant each.

Each has its KEYS/ARGV header (after the shared Lua functions it uses). They are
registered once per client (``redis.Redis.register_script``) and run by EVALSHA.
"""

_FORGET_ACTIVATION = """
-- A pruned checkpoint takes its activation's bookkeeping with it: the attempts entry
-- (fencing of the activation's late attempts; the run's record fences them once it is
-- gone, since an activation no longer pending is never committed again) and its marker.
local function forget_activation(acts, attempts, markers, id)
  local activation = redis.call('HGET', acts, id)
  if not activation then return end
  redis.call('HDEL', acts, id)
  local entry = redis.call('HGET', attempts, activation)
  if entry and string.sub(entry, -(#id + 1)) == '|' .. id then
    redis.call('HDEL', attempts, activation)
    redis.call('HDEL', markers, activation)
  end
end
"""

COMMIT = (
    _FORGET_ACTIVATION
    + """
-- Commit one checkpoint: idempotent per activation, gapless sequence, pruning.
-- KEYS[1] meta hash      KEYS[2] history zset   KEYS[3] attempts hash
-- KEYS[4] pins set       KEYS[5] runs index     KEYS[6] checkpoint index
-- KEYS[7] active runs index  KEYS[8] leases zset  KEYS[9] lease owners hash
-- KEYS[10] dispatch markers hash  KEYS[11] checkpoint id -> activation key hash
-- ARGV[1] checkpoint id
-- ARGV[2] snapshot JSON opening with '{"seq":' and a 12-space slot the seq is written into
-- ARGV[3] activation ('' = none)   ARGV[4] attempt token
-- ARGV[5] expected seq ('' = any)  ARGV[6] max checkpoints (0 = keep all)
-- ARGV[7] now (unix seconds)       ARGV[8] run id
-- ARGV[9] snapshot key prefix      ARGV[10] run status   ARGV[14] epoch
-- ARGV[11] A = meta field pairs set every commit, ARGV[12] B = pairs set on a new run,
-- ARGV[13] C = activations the caller dispatches next (marked sent now);
-- then A pairs, B pairs and C activations.
-- Returns {'ok', seq} | {'dup', checkpoint id} | {'stale', checkpoint id}
--       | {'conflict', current seq}
local activation = ARGV[3]
if activation ~= '' then
  local prev = redis.call('HGET', KEYS[3], activation)
  if prev then
    local sep = string.find(prev, '|', 1, true)
    local cid = string.sub(prev, sep + 1)
    if string.sub(prev, 1, sep - 1) == ARGV[4] then return {'dup', cid} end
    return {'stale', cid}
  end
end
local cur = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= cur then return {'conflict', tostring(cur)} end
local seq = cur + 1
local id, now, run = ARGV[1], ARGV[7], ARGV[8]
local snapshot = ARGV[9] .. id
redis.call('SET', snapshot, ARGV[2])
redis.call('SETRANGE', snapshot, 7, string.format('%12d', seq))
redis.call('ZADD', KEYS[2], seq, id)
if activation ~= '' then
  redis.call('HSET', KEYS[3], activation, ARGV[4] .. '|' .. id)
  redis.call('HSET', KEYS[11], id, activation)
  if ARGV[4] ~= '' then
    -- A committed step needs no lease; dropping it here leaves none behind if the
    -- committer dies right after the commit. (In-process steps have no token, no lease.)
    redis.call('ZREM', KEYS[8], activation)
    redis.call('HDEL', KEYS[9], activation)
  end
end
-- Markers and leases serve a running run in one epoch: a run that stops, or a resume
-- into a new epoch, leaves none behind (old-epoch messages and attempts are skipped,
-- and a resume dispatches every pending step again).
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if ARGV[10] ~= 'running' or (epoch and epoch ~= ARGV[14]) then
  redis.call('DEL', KEYS[8], KEYS[9], KEYS[10])
end
local i = 15
local fields = {'seq', seq, 'latest', id, 'updated_at', now, 'status', ARGV[10], 'epoch', ARGV[14]}
for j = i, i + 2 * tonumber(ARGV[11]) - 1 do fields[#fields + 1] = ARGV[j] end
redis.call('HSET', KEYS[1], unpack(fields))
i = i + 2 * tonumber(ARGV[11])
if cur == 0 then
  redis.call('HSETNX', KEYS[1], 'created_at', now)
  redis.call('HSETNX', KEYS[1], 'run_id', run)
  for j = i, i + 2 * tonumber(ARGV[12]) - 1, 2 do
    redis.call('HSETNX', KEYS[1], ARGV[j], ARGV[j + 1])
  end
end
i = i + 2 * tonumber(ARGV[12])
for j = i, i + tonumber(ARGV[13]) - 1 do redis.call('HSETNX', KEYS[10], ARGV[j], now) end
redis.call('ZADD', KEYS[5], now, run)
redis.call('HSET', KEYS[6], id, run)
if ARGV[10] == 'running' then
  redis.call('ZADD', KEYS[7], now, run)
else
  redis.call('ZREM', KEYS[7], run)
end
local keep = tonumber(ARGV[6])
if keep > 0 and seq > keep then
  local extra = redis.call('ZCARD', KEYS[2]) - keep
  if extra > 0 then
    for _, old in ipairs(redis.call('ZRANGE', KEYS[2], 0, extra - 1)) do
      if redis.call('SISMEMBER', KEYS[4], old) == 0 then
        redis.call('DEL', ARGV[9] .. old)
        redis.call('ZREM', KEYS[2], old)
        redis.call('HDEL', KEYS[6], old)
        forget_activation(KEYS[11], KEYS[3], KEYS[10], old)
      end
    end
  end
end
return {'ok', tostring(seq)}
"""
)

PRUNE = (
    _FORGET_ACTIVATION
    + """
-- Delete all but the newest ARGV[1] checkpoints of a run, sparing pinned ones.
-- KEYS[1] history zset   KEYS[2] pins set   KEYS[3] checkpoint index
-- KEYS[4] checkpoint id -> activation key hash   KEYS[5] attempts hash
-- KEYS[6] dispatch markers hash
-- ARGV[1] keep           ARGV[2] snapshot key prefix   ARGV[3] '1' = dry run
-- Returns the ids deleted (or that would be).
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
local gone = {}
if extra <= 0 then return gone end
for _, old in ipairs(redis.call('ZRANGE', KEYS[1], 0, extra - 1)) do
  if redis.call('SISMEMBER', KEYS[2], old) == 0 then
    gone[#gone + 1] = old
    if ARGV[3] ~= '1' then
      redis.call('DEL', ARGV[2] .. old)
      redis.call('ZREM', KEYS[1], old)
      redis.call('HDEL', KEYS[3], old)
      forget_activation(KEYS[4], KEYS[5], KEYS[6], old)
    end
  end
end
return gone
"""
)

UPDATE_RUN = """
-- Set fields of an existing run's metadata and touch the run index.
-- KEYS[1] meta hash   KEYS[2] runs index   KEYS[3] active runs index
-- ARGV[1] run id      ARGV[2] now   ARGV[3] fields JSON
-- Returns 0 when the run does not exist, else 1.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local fields = {'updated_at', ARGV[2]}
for k, v in pairs(cjson.decode(ARGV[3])) do
  fields[#fields + 1] = k
  fields[#fields + 1] = v
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'status') == 'running' then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
else
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return 1
"""

DELETE_RUN = """
-- Remove a run: its snapshots, history, metadata and index entries.
-- KEYS[1] meta  KEYS[2] history  KEYS[3] attempts  KEYS[4] pins  KEYS[5] dispatched
-- KEYS[6] leases  KEYS[7] runs index  KEYS[8] checkpoint index  KEYS[9] active index
-- KEYS[10] lease owners  KEYS[11] checkpoint id -> activation key hash
-- ARGV[1] run id  ARGV[2] snapshot key prefix
-- Returns 1 when the run existed, else 0.
local existed = redis.call('EXISTS', KEYS[1])
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  redis.call('DEL', ARGV[2] .. id)
  redis.call('HDEL', KEYS[8], id)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[10], KEYS[11])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('ZREM', KEYS[9], ARGV[1])
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

BEGIN_STEP = """
-- Read a run's latest checkpoint and, unless the activation was committed, take its lease.
-- KEYS[1] history zset   KEYS[2] attempts hash   KEYS[3] leases zset   KEYS[4] lease owners hash
-- ARGV[1] snapshot key prefix   ARGV[2] activation ('' = read only)   ARGV[3] attempt token
-- ARGV[4] lease expiry          ARGV[5] now
-- Returns {snapshot JSON | nil, outcome[, holder]}; outcome 'none' (no run), 'read' (read
-- only), 'done' (committed), 'held' (a live lease of the attempt ``holder``) or 'ok' (the
-- caller's lease).
local ids = redis.call('ZREVRANGE', KEYS[1], 0, 0)
if #ids == 0 then return {false, 'none'} end
local blob = redis.call('GET', ARGV[1] .. ids[1])
if ARGV[2] == '' then return {blob, 'read'} end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return {blob, 'done'} end
local owner = redis.call('HGET', KEYS[4], ARGV[2])
local expiry = redis.call('ZSCORE', KEYS[3], ARGV[2])
if owner and owner ~= ARGV[3] and expiry and tonumber(expiry) > tonumber(ARGV[5]) then
  return {blob, 'held', owner}
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
return {blob, 'ok'}
"""

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
