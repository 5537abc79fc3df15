"""Large-model parallelism: the device mesh (`layout`) and a transformer's work split over it (`split`);
the `mesh` strategy (sim/strategies/mesh.py) runs them, `memory` and `analytic` give closed forms."""
