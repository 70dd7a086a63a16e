"""The Nexmark queries written for Bytewax 0.21 (clasp/bench/peers/nexmark_bytewax.py) give the reference's exact
answers on generated events, in order and out of order within the generator's bound."""

from __future__ import annotations

import importlib.util

import pytest

from clasp.apps import nexmark as nx

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bytewax") is None,
                                reason="Bytewax is not installed: pip install '.[peers]'")

SLOW = nx.Config(first_event_rate=100)
SLOW_SHUFFLED = nx.Config(first_event_rate=100, out_of_order_group=40)


@pytest.mark.parametrize("config,batch", [(SLOW, 1), (SLOW_SHUFFLED, 1), (SLOW_SHUFFLED, 500)],
                         ids=["in_order", "out_of_order", "out_of_order_batches"])
@pytest.mark.parametrize("query", sorted(nx.QUERIES))
def test_each_bytewax_query_equals_the_reference(query, config, batch):
    from bytewax.testing import TestingSink, TestingSource, run_main

    from clasp.bench.peers import nexmark_bytewax as bw

    events = nx.generate(6000, 11, config)
    rows: list = []
    # A batch of `batch` events spans (batch - 1) / rate s of event time: the disorder a merge can add.
    bound = nx.max_out_of_order(config) + (batch - 1) * 1000 // config.first_event_rate + 1
    run_main(bw.build(query, TestingSource(events, batch_size=batch), TestingSink(rows), bound))
    want = nx.QUERIES[query](events)
    assert want
    assert bw.answer(query, rows) == want


@pytest.mark.parametrize("query", sorted(nx.QUERIES))
def test_bytewax_given_the_events_json_lines_decodes_them_to_the_same_answer(query):
    """The benchmark's default feed: Bytewax decodes each JSON line, as clasp's readers do."""
    import json

    from bytewax.testing import TestingSink, TestingSource, run_main

    from clasp.bench.peers import nexmark_bytewax as bw

    events = nx.generate(3000, 5, SLOW)
    rows: list = []
    lines = [json.dumps(e) for e in events]
    run_main(bw.build(query, TestingSource(lines, batch_size=100), TestingSink(rows),
                      nx.max_out_of_order(SLOW) + 100 * 1000 // SLOW.first_event_rate, decode=True))
    assert bw.answer(query, rows) == nx.QUERIES[query](events)
