"""Two versions of one flow module, ``deploy_flows``, as two deploys of an app have it: a
worker or CLI process puts ``v1/`` or ``v2/`` on its ``PYTHONPATH`` (the import path of each
flow, ``deploy_flows:<Class>``, is the same in both)."""

from pathlib import Path

HERE = Path(__file__).parent
V1, V2 = HERE / "v1", HERE / "v2"
