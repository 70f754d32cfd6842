"""The C++ CPU kernels (csrc/): `pip install` puts libvllm_cpu_kernels.so here (see setup.py
and CMakeLists.txt); `cpu_kernels` loads it with ctypes and `cpu_kernel_calls` wraps its
entry points for torch tensors. The bottom layer: it imports nothing of vllm but `envs` and
the logger, so attention backends, layers and platforms all reach it downwards."""
