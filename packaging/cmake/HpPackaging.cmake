# CPack: `cpack -G DEB` in a build directory makes hp_<version>_<arch>.deb from the install rules
# (PREFIX /usr). The installed hp finds lib/hp/plugins and share/hp relative to its own executable,
# so the package also works unpacked anywhere (dpkg-deb -x), which tests/install/deb_install.sh checks.
include_guard(GLOBAL)

# Packaging and installing never build: with the Makefile generator, cpack would otherwise build the
# whole `all` target (every test included) before packaging. Build first (packaging/build.sh), as
# `cmake --install` also expects.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME hp)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "hp developers <hp@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "plan, shard, profile, launch and verify parallel executions of large models")
set(CPACK_PACKAGE_DESCRIPTION
    "hp reads an ONNX model and TOML recipes and plans (data, tensor, pipeline, expert and optimizer-state\n\
parallelism), shards, memory-profiles, launches (Open MPI) and verifies parallel executions on Ascend NPU\n\
supernodes, NVIDIA GPU clusters and CPUs. Backends are plugins: cpu (oneDNN) is always usable; the ascend\n\
and cuda plugins load the vendor runtimes at run time and say what is missing.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# Packages carry no debug info: RelWithDebInfo binaries are ~30x larger (hp: 110 MB, stripped 3.3 MB).
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends on the shared libraries hp and the plugins link (fmt, protobuf, onnx, Open MPI, oneDNN,
# libgomp, libstdc++, ...) come from dpkg-shlibdeps, so they follow the build machine's versions.
# mpirun is executed rather than linked, so openmpi-bin is named by hand. CUDA and CANN are optional
# and found at run time.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "openmpi-bin")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "man-db")

include(CPack)
