"""OneFlow 0.9's workarounds, in one quarantined place: each module says in its first lines what
OneFlow does wrong and how to tell when it is no longer needed.

- ``flow_import``: importing OneFlow (its CUDA libraries preloaded; signals, fd 2 and os.environ left as they were)
- ``process``: a command's process rules (signals, exit codes, one writer of os.environ)
- ``oneflow_fix`` (+ ``oneflow_fix.c``): the graph-launch race guarded
- ``blas`` (+ ``blas_shim.c``): a threaded BLAS under OneFlow's single-threaded CPU GEMMs
- ``kernels`` (+ ``cpu_kernels.c``): CPU LayerNorm, GELUs, bias adds, heads, softmax on every core, checked
- ``train_kernels`` (+ ``cpu_train_kernels.c``): LayerNorm and GELU with their backward for CPU training steps, checked
- ``native``: builds and loads the C shims

The model layer reaches them only through :mod:`bert_of._flow`.
"""
