#!/bin/sh
# Source this to use PyTorch from PyPI on a machine with no GPU: the PyPI
# wheel is the CUDA build, which loads a few CUDA runtime libraries at import
# time even when it only runs on the CPU. Needed only to regenerate the
# committed test fixtures (scripts/*_ref.py), never by `make test`.
#   python3 -m pip install torch nvidia-cufile nvidia-cusparselt-cu13 \
#       nvidia-nvshmem-cu13 nvidia-nccl-cu13 gguf numpy
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/nvshmem/lib:$SP/nvidia/nccl/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
