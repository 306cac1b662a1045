"""``python -m bench``: every workload, one after another, printing its figures."""

from bench import pii_throughput, w1, w2

w1.report()
print()
w2.report()
print()
pii_throughput.main()
