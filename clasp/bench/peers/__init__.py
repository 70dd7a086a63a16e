"""A peer benchmark: Word Count on the same generated lines with clasp and with Bytewax (`python -m clasp.bench.peers`).

Bytewax is an optional extra (`pip install .[peers]`); the dataflow is `clasp/bench/peers/bytewax_flow.py`.
"""
