#pragma once
// The tensors in an op's argument or result, as the recorder and the checker
// read them off the dispatcher's stack (one level of lists and tuples, as
// nanscope.backends.torch.ops.tensors_of does in Python).
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

namespace nanscope {

using Tensors = c10::SmallVector<at::Tensor, 4>;

inline void tensors_of(const c10::IValue& v, Tensors& out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined()) out.push_back(t);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined()) out.push_back(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor() && e.toTensor().defined()) out.push_back(e.toTensor());
    }
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (e.isTensor() && e.toTensor().defined()) out.push_back(e.toTensor());
    }
  }
}

}  // namespace nanscope
