"""The discrete-time simulator of a clasp cluster (`clasp.sim.simulator`), with its cost files as package
data: `sim_costs.json` (this runtime's coefficients), `sim_costs_paper.json`, and, once calibrated,
`sim_costs_measured.json`."""
