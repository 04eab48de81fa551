#include "runtime/bit_mask.h"

#include <ATen/ATen.h>

namespace ht {
namespace {

at::Tensor bit_values(const at::Device& device) {
  return at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, at::TensorOptions().dtype(at::kByte)).to(device);
}

}  // namespace

at::Tensor pack_bits(const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "pack_bits: a bool mask, got ", mask.scalar_type());
  const int64_t n = mask.numel();
  at::Tensor bytes = mask.reshape({-1}).to(at::kByte);
  if (n % 8 != 0) bytes = at::constant_pad_nd(bytes, {0, 8 - n % 8}, 0);
  // Each row of eight 0/1 bytes times 1, 2, ..., 128, summed: no carries, exactly the byte.
  return at::sum(bytes.view({-1, 8}).mul(bit_values(mask.device())), {1}, false, at::kByte);
}

at::Tensor unpack_bits(const at::Tensor& packed, at::IntArrayRef sizes) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 1, "unpack_bits: packed bytes, got ",
              packed.scalar_type(), " of ", packed.dim(), " dimensions");
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  TORCH_CHECK(packed.numel() == (n + 7) / 8, "unpack_bits: ", packed.numel(), " bytes cannot hold ", n, " bits");
  const at::Tensor bits = packed.unsqueeze(1).bitwise_and(bit_values(packed.device())).ne(0);
  return bits.reshape({-1}).narrow(0, 0, n).view(sizes);
}

}  // namespace ht
