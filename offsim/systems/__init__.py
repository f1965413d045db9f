"""Systems: one file per published system, each a composition of mechanisms along an order,
compiled into a schedule (:mod:`offsim.systems._registry`: how a strategy's ``system:`` finds its
file; :mod:`offsim.systems._parts`: the mechanisms' arguments from a strategy's knobs;
:mod:`offsim.systems._compile`: a composition into a schedule)."""
