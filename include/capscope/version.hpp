#pragma once
//! @file
//! capscope's version, the one source of truth: meson.build refuses to configure when its project
//! version differs, and `capscope-check --version` prints it. Semantic versioning for 0.x: the
//! minor number moves with every batch of breaking changes (CHANGELOG.md lists them).

#define CAPSCOPE_VERSION_MAJOR 0
#define CAPSCOPE_VERSION_MINOR 3
#define CAPSCOPE_VERSION_PATCH 0
#define CAPSCOPE_VERSION_STRING "0.3.0"

namespace capscope {

struct version_number {
    int major, minor, patch;
};
inline constexpr version_number version{CAPSCOPE_VERSION_MAJOR, CAPSCOPE_VERSION_MINOR, CAPSCOPE_VERSION_PATCH};

} // namespace capscope
