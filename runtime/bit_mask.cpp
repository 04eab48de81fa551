#include "runtime/bit_mask.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace ht {
namespace {

constexpr int64_t kGrain = 1 << 14;  // bytes of packed mask per parallel chunk

at::Tensor bit_values(const at::Device& device) {
  return at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, at::TensorOptions().dtype(at::kByte)).to(device);
}

}  // namespace

at::Tensor pack_bits(const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "pack_bits: a bool mask, got ", mask.scalar_type());
  const int64_t n = mask.numel();
  const at::Tensor flat = mask.reshape({-1}).contiguous();
  if (!mask.is_cpu()) {
    at::Tensor bytes = flat.to(at::kByte);
    if (n % 8 != 0) bytes = at::constant_pad_nd(bytes, {0, 8 - n % 8}, 0);
    // Each row of eight 0/1 bytes times 1, 2, ..., 128, summed: no carries, exactly the byte.
    return at::sum(bytes.view({-1, 8}).mul(bit_values(mask.device())), {1}, false, at::kByte);
  }
  at::Tensor packed = at::empty({(n + 7) / 8}, at::TensorOptions().dtype(at::kByte));
  const bool* in = flat.data_ptr<bool>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  at::parallel_for(0, packed.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      uint8_t b = 0;
      const int64_t last = std::min<int64_t>(8, n - 8 * j);
      for (int64_t k = 0; k < last; ++k) b |= static_cast<uint8_t>(in[8 * j + k]) << k;
      out[j] = b;
    }
  });
  return packed;
}

at::Tensor unpack_bits(const at::Tensor& packed, at::IntArrayRef sizes) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 1, "unpack_bits: packed bytes, got ",
              packed.scalar_type(), " of ", packed.dim(), " dimensions");
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  TORCH_CHECK(packed.numel() == (n + 7) / 8, "unpack_bits: ", packed.numel(), " bytes cannot hold ", n, " bits");
  if (!packed.is_cpu()) {
    const at::Tensor bits = packed.unsqueeze(1).bitwise_and(bit_values(packed.device())).ne(0);
    return bits.reshape({-1}).narrow(0, 0, n).view(sizes);
  }
  at::Tensor mask = at::empty(sizes, at::TensorOptions().dtype(at::kBool));
  const at::Tensor bytes = packed.contiguous();
  const uint8_t* in = bytes.data_ptr<uint8_t>();
  bool* out = mask.data_ptr<bool>();
  at::parallel_for(0, bytes.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t last = std::min<int64_t>(8, n - 8 * j);
      for (int64_t k = 0; k < last; ++k) out[8 * j + k] = (in[j] >> k) & 1;
    }
  });
  return mask;
}

}  // namespace ht
