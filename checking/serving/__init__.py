"""The serving layers' searches: `check --engine`'s cases, runs and search over a real serving engine (LMCache's own
path: `engine_cases`, `engine_run`, `engine_search`) or a whole serving stack (vLLM or SGLang with a KV connector:
`stack_cases`, `stack_run`, `stack_search`), and the minimiser of their cases (`serving_minimise`). The cases are
`model.engine_case`'s and `model.stack_case`'s, judged by `model.engine_oracle` and `model.stack_oracle`; the
deployments and stacks they run on are the adapters' (`runtime.serving` resolves them); a finding is written as an
`engine` or `stack` trace, replayed by `checking.replay`. Nothing is imported here: each module is imported by name."""
