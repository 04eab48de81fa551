# Sourced on the GPU machine (scripts/device-run.sh does): Open MPI from the Debian packages that
# scripts/device-deps.sh put in .deps/openmpi, unpacked into /tmp/openmpi and relocated there
# (OPAL_PREFIX), with mpirun and mpicxx on PATH, so the device build finds MPI and several ranks
# share the one GPU (issue 67). The machine has no MPI of its own and no package registry.
# Nothing is unpacked into /: the packages' libraries stay under /tmp/openmpi.
if [ -d .deps/openmpi ] && [ -z "${HT_DEVICE_NO_MPI:-}" ]; then
  if [ ! -x /tmp/openmpi/usr/bin/orterun ]; then
    mkdir -p /tmp/openmpi
    for deb in .deps/openmpi/*.deb; do dpkg -x "$deb" /tmp/openmpi; done
    ln -sf orterun /tmp/openmpi/usr/bin/mpirun
    ln -sf mpicxx.openmpi /tmp/openmpi/usr/bin/mpicxx
    ln -sf mpicc.openmpi /tmp/openmpi/usr/bin/mpicc
  fi
  export OPAL_PREFIX=/tmp/openmpi/usr
  export PATH=/tmp/openmpi/usr/bin:$PATH
  export LD_LIBRARY_PATH=/tmp/openmpi/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Shared memory between the ranks of one machine; no network transports are carried.
  export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
