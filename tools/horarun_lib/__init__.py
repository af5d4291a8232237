# SPDX-License-Identifier: Apache-2.0
"""horarun's program, run by the script tools/horarun (docs/architecture.md):

    cli        main(): checks the command line, runs one of the modes
    args       the parser, --help (with hora-info's knobs), the checks, the program's argv
    local      local mode: LocalJob runs this machine's ranks (the agents' workers too)
    store      StoreClient (the store's protocol and token proof) and StoreProcess (hora-store)
    agent      what both agents share: Agent, the Leader thread, waiting for the store
    restart    restart mode (torchrun's model): rounds of workers
    elastic    elastic mode (Horovod's model): survivors carry on in new worlds
    mpirun     multi-host mode: the hosts, the pml, the mpirun command
    common     shared: launcher variables, the job token, tool lookup, output, errors

Standard library only; runs with any python3 >= 3.9.
"""
