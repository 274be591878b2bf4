"""σ-MoE reference framework: framework, models, kernels and tasks (docs/DESIGN.md "Layout")
in one package, so that PyPI's `kernels` and `tasks` cannot shadow them.

Importing it imports nothing: `sigma_moe.kernels` needs torch and triton only (the GPU
machines have no Hydra).
"""
