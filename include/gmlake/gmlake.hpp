// gmlake/gmlake.hpp - the umbrella header: the allocator, its policies and the
// portable backends (simulated and the decorators), the std::pmr view and the
// recording adaptor and the settings parser. Not included here: backend/host_memfd.hpp
// (Linux only) and backend/cuda_vmm.hpp (the CUDA toolkit's <cuda.h>); include those
// where needed.
#pragma once

#include "allocator.hpp"
#include "allocator_concept.hpp"
#include "backend/counting.hpp"
#include "backend/forwarding.hpp"
#include "backend/fault_injecting.hpp"
#include "backend/simulated.hpp"
#include "concepts.hpp"
#include "configs.hpp"
#include "errors.hpp"
#include "host_stream.hpp"
#include "memory_resource.hpp"
#include "recording.hpp"
#include "settings.hpp"
#include "stats.hpp"
