#pragma once
//! @file
//! CUPTI's callback entry points, loaded from libcupti at run time (`dlopen`): the capture doctor
//! and the step meter use them without a link dependency, and say why when they cannot be had.

#include <cupti.h>

#include <dlfcn.h>

#include <cstdint>
#include <string>

namespace capscope::detail {

//! CUPTI's entry points, from libcupti at run time (absent: the doctor cannot watch, and says so).
struct cupti_entry_points {
    CUptiResult (*subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*) = nullptr;
    CUptiResult (*enable_domain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain) = nullptr;
    CUptiResult (*unsubscribe)(CUpti_SubscriberHandle) = nullptr;
    std::string missing; //!< why they could not be loaded ("" when they were)

    static const cupti_entry_points& get() {
        static const cupti_entry_points e = [] {
            cupti_entry_points p;
            void* lib = nullptr;
            for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12"})
                if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
            if (!lib) {
                p.missing = "libcupti could not be loaded (add the CUDA toolkit's lib64 to the library path)";
                return p;
            }
            p.subscribe = reinterpret_cast<decltype(p.subscribe)>(dlsym(lib, "cuptiSubscribe"));
            p.enable_domain = reinterpret_cast<decltype(p.enable_domain)>(dlsym(lib, "cuptiEnableDomain"));
            p.unsubscribe = reinterpret_cast<decltype(p.unsubscribe)>(dlsym(lib, "cuptiUnsubscribe"));
            if (!p.subscribe || !p.enable_domain || !p.unsubscribe) p.missing = "libcupti lacks the callback API";
            return p;
        }();
        return e;
    }
};

} // namespace capscope::detail
