#pragma once
// An environment variable set for a scope and put back after it (a GPU test that runs with
// NCCL_GRAPH_MIXING_SUPPORT=0, say, without changing the cases after it).

#include <cstdlib>
#include <string>

struct scoped_environment {
    std::string name, before;
    bool was_set;
    scoped_environment(const char* variable, const char* value) : name(variable) {
        const char* b = std::getenv(variable);
        was_set = b != nullptr;
        if (b) before = b;
        setenv(variable, value, 1);
    }
    scoped_environment(const scoped_environment&) = delete;
    scoped_environment& operator=(const scoped_environment&) = delete;
    ~scoped_environment() {
        if (was_set) setenv(name.c_str(), before.c_str(), 1);
        else unsetenv(name.c_str());
    }
};
