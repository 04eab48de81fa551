#pragma once
// torch::optim keys its per-parameter state by the parameter's TensorImpl: as the address's text
// in libtorch 1.13, as the pointer itself in later versions. state_key<Key>(param) with Key the
// state map's key type (std::decay_t<decltype(optimizer.state())>::key_type).

#include <ATen/core/Tensor.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace ht {

template <typename Key>
Key state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

}  // namespace ht
