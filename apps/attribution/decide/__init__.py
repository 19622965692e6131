"""The pure inference and decisions: always-valid confidence sequences on cost per unit of work
(`stats`), the quality rule (`quality`), the freeze rule written once (`freeze_rule`), what a tick
decides from the sums (`decisions`), the traffic weights toward cheaper arms (`weights`) and the
verdict per arm that the freeze rule stands behind (`verdict`). No ORM, no clock: the same sums
and policy in give the same verdict out.
"""
