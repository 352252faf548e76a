#pragma once
// enable_check_numerics in native code (checker.cpp): its Python interface,
// added to the extension's module by recorder.cpp's PYBIND11_MODULE.
#include <pybind11/pybind11.h>

namespace nanscope {

void add_checker(pybind11::module_& m);

}  // namespace nanscope
