/* cuda_bf16.h for the CPU emulation of the CUDA backend (../cuda_emu.h) */
#include "../cuda_emu.h"
