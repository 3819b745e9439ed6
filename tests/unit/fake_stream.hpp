#pragma once
// A stream handle that is never given to CUDA: the host tests' eager steps only pass it to their
// fake stages. One definition for every file of runner_host_tests.

#include <cuda_runtime_api.h>

namespace host_tests {
inline int not_a_stream = 0;
inline const auto fake_stream = reinterpret_cast<cudaStream_t>(&not_a_stream);
} // namespace host_tests
