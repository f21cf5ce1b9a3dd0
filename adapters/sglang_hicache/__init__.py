"""`--engine sglang-hicache`: SGLang 0.5.23's own HiCache controller (its L3 storage prefetch: the hit query, the MIN
agreement over real gloo processes, the page load and the ack MIN; and its write-back) as a
`model.contract.ServingStack` (see `sgl_stack`, and docs/CONTRACT.md, "Serving stacks")."""
