"""The tick's evidence: run totals rolled up into one observation per run and window (`rollup`),
an arm's observations summed per window or epoch with the run-level moments (`moments`), arms
compared on usage priced at one table (`comparison`), and only within one hardware class
(`device_classes`). SQL and the ORM live here; what is decided from the sums is `decide`'s.
"""
