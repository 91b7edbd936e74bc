"""Offline stand-in for @rules_cc//cc:defs.bzl.

Bazel 4's @bazel_tools loads these symbols from @rules_cc; Debian's rules_cc is
too new for Bazel 4, and this project builds no C++. Each symbol forwards to the
native rule of the same name. (Starlark forbids nested functions, so each one is
written out.)
"""

def cc_library(**kwargs):
    native.cc_library(**kwargs)

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)

def cc_test(**kwargs):
    native.cc_test(**kwargs)

def cc_import(**kwargs):
    native.cc_import(**kwargs)

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)

def objc_library(**kwargs):
    native.objc_library(**kwargs)

def objc_import(**kwargs):
    native.objc_import(**kwargs)

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)

def fdo_profile(**kwargs):
    native.fdo_profile(**kwargs)

def fdo_prefetch_hints(**kwargs):
    native.fdo_prefetch_hints(**kwargs)
