"""The hooks the host collector installs in torch, one module per concern.

Each concern is a small object that follows :class:`advisor.collect.hooks.base.Hooks`:
``install(patches)`` puts its wrappers and hooks in place (every change recorded in
``patches`` so one uninstall undoes them all) and ``fill(result)`` writes what it found
into the run's :class:`~advisor.collect.hooks.collection.HostCollection`.

``recorder``  torch.profiler's life cycle: the recorded window, parts, the ranges it hears
``steps``     steps and phases: where a step begins and ends, forward/backward/optimizer
``loaders``   what each DataLoader is and what its reads, fetches and collation took
``syncs``     host-blocking calls (``.item()``, ``.cpu()``, ``synchronize``) per source line
``uploads``   copies to a GPU from pageable memory, counted as host-blocking calls
``children``  processes the script starts, and the ranks torch.multiprocessing.spawn starts
``compiles``  torch.compile's compilations: when, in which step, how long

The collector that composes them is advisor.collect.torch_hooks.HostCollector; the wrappers
find it through :func:`advisor.collect.hooks.base.acting`.
"""
