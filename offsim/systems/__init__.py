"""Systems: one file per published system (or the generic one that carries today's strategy
knobs), each a composition of mechanisms along an order, compiled into a schedule."""
