"""Marginal workloads in the residual basis (ResidualPlanner, Xiao, Wang, Ding, Kifer, NeurIPS
2023): the closure and design coefficients (:mod:`.basis`), the optimal noise design
(:mod:`.design`), measuring (:mod:`.measure`) and the unbiased reconstruction
(:mod:`.reconstruct`)."""
