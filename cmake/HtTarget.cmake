# Common settings for every hybrid_train target.
function(ht_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  # Torch's ABI flag (_GLIBCXX_USE_CXX11_ABI) must match the libtorch we link.
  separate_arguments(_ht_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(${target} PUBLIC ${_ht_torch_flags})
  # Loading a precompiled header of ATen (and torch/nn for models and tests) costs about 5 s per
  # translation unit on CI's machine, more than most files take to compile: four files to a unit
  # (CMake's unity build) keeps the 2-core CI build inside its time. Names private to a file
  # must therefore be unique within its folder's target.
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
endfunction()
