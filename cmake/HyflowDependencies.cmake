# Finds the third-party libraries. All come from Debian packages (scripts/install-deps.sh);
# on GPU machines LibTorch 2.x (CUDA) comes from the Python torch package.

find_package(Threads REQUIRED)
find_package(Torch REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(cereal REQUIRED)
find_package(CAF 0.17 REQUIRED)

# LibTorch's CMake config appends -D_GLIBCXX_USE_CXX11_ABI to the torch target; nothing else
# needs to be set globally.
message(STATUS "hyflow: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}), CAF ${CAF_VERSION}")
