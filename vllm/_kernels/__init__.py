"""Where `pip install` puts libvllm_cpu_kernels.so, the C++ CPU kernels built from csrc/
(see setup.py and CMakeLists.txt); loaded by vllm.model_executor.layers.cpu_kernels."""
