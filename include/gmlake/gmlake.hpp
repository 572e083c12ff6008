// gmlake/gmlake.hpp - the umbrella header: everything but the CUDA backend.
#pragma once

#include "allocator.hpp"
#include "backend/counting.hpp"
#include "backend/forwarding.hpp"
#include "backend/fault_injecting.hpp"
#include "backend/host_memfd.hpp"
#include "backend/simulated.hpp"
#include "concepts.hpp"
#include "configs.hpp"
#include "errors.hpp"
#include "memory_resource.hpp"
#include "stats.hpp"
