"""LMCache's own lookup-and-load path as the thing under test (`--engine lmcache`, `--engine lmcache-patched`).

- `deployment`: `LMCacheDeployment`, N real `LMCacheEngine` ranks per model on real Valkey, the real lookup servers
  and the scheduler's real sync or async lookup client (`model.contract.EngineDeployment`; its server faults are
  the nemesis's held form, `adapters.nemesis.Nemesis.hold`); `factory` names it;
- `rank_side`: one rank's engines and what a worker does with them (in this process or a rank process's);
- `process_deployment`, `rank_process_main`: `--runner processes`, one OS process per rank;
- `closing`: closes that cannot hang the run (parked receives woken, a stuck RESP close unstuck);
- `connector`: the CPU connector that copies real KV bytes;
- `zmq_paths`: LMCache's socket files in a private directory, removed after every case.

Importing this package imports neither torch nor LMCache; building a deployment does.
"""
