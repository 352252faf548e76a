#pragma once
// How the recorder and the checker know an op again: by addresses the dispatcher
// keeps while the op is registered (its registration, its schema's name), and a
// listener that makes them forget every op when any op leaves the dispatcher (a
// torch.library Library destroyed), as its addresses may then be another op's.
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <memory>

namespace nanscope {

// The address of the op's registration, which the handle holds (std::hash gives it):
// read without touching the op's entry, a cache line the dispatcher did not touch.
inline const void* registration_of(const c10::OperatorHandle& op) {
  return reinterpret_cast<const void*>(std::hash<c10::OperatorHandle>{}(op));
}

// Calls `forget` whenever an op is removed from the dispatcher, for the rest of the
// process: leaked on purpose, as unregistering at exit would run after the dispatcher
// is gone.
inline void forget_ops_when_removed(void (*forget)()) {
  struct Listener : c10::OpRegistrationListener {
    explicit Listener(void (*f)()) : forget(f) {}
    void onOperatorRegistered(const c10::OperatorHandle&) override {}
    void onOperatorDeregistered(const c10::OperatorHandle&) override { forget(); }
    void (*forget)();
  };
  new c10::RegistrationHandleRAII(
      c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<Listener>(forget)));
}

}  // namespace nanscope
