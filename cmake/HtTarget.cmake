# Common settings for every hybrid_train target.
function(ht_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  # Torch's ABI flag (_GLIBCXX_USE_CXX11_ABI) must match the libtorch we link.
  separate_arguments(_ht_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(${target} PUBLIC ${_ht_torch_flags})
endfunction()
