"""A peer benchmark: Word Count on the same generated lines with clasp and with Bytewax (`python -m bench.peers`).

Bytewax is an optional extra (`pip install .[peers]`); the dataflow is `bench/peers/bytewax_flow.py`.
"""
