"""σ-MoE reference framework: one package, so that its parts cannot collide with other
installed packages (PyPI has a `kernels` and a `tasks`).

    framework/  model-agnostic machinery: registry, configs, trainer, checkpoints, data
    models/     Transformer-XL and the FFN variants (pure nn.Modules)
    kernels/    CVMM: Triton kernels, torch paths, the per-expert reference, dispatch
    tasks/      the language-modelling task: data, model, loss, evaluation

Importing it imports nothing: `sigma_moe.kernels` needs torch and triton only (the GPU
machines have no Hydra).
"""
