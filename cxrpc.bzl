"""Shared build settings: warnings as errors for project code, one way to declare tests."""

CXR_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

def cxr_test(name, srcs, deps = [], tags = [], size = "medium", **kwargs):
    """A googletest suite (C++ file) testing C code under test."""
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = CXR_COPTS,
        deps = deps + ["//tests:gtest", "//tests:root"],
        tags = tags,
        size = size,
        **kwargs
    )
