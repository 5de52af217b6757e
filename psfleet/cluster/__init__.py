"""Running a job on the cluster managers users already have.

- :mod:`psfleet.cluster.job`: the job every route renders (the config as the pods see
  it, the server and worker counts, the command each process runs);
- :mod:`psfleet.cluster.k8s`: Kubernetes manifests (``psfleet k8s render``);
- :mod:`psfleet.cluster.slurm`: an sbatch script (``psfleet slurm render``).

MPI needs no rendering: ``mpirun`` starts the processes and
:class:`psfleet.fleet.role_maker.MPIRoleMaker` gives each its role. docs/cluster.md is
the user's page.
"""
