"""Key and value formats framed for a schema registry: what the user says, as plain data.

``AvroFormat()`` encodes the column as Avro with a schema derived from the DataFrame, registered under
``<topic>-value`` (or ``-key``) when it is new. The schema may be given instead, as text (``schema=``)
or as a registered version (``version=3`` or ``"latest"``); the subject follows a naming strategy
(topic, record, topic-record) unless given; ``auto_register=False`` forbids registering, as many
production registries do. ``JsonSchemaFormat`` is the same for JSON Schema. Protobuf is left out: its
framing adds message indexes after the schema id, and Spark's ``to_protobuf`` needs a compiled
descriptor file, which a registry does not hand out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar


class SubjectStrategy(StrEnum):
    """Confluent's subject name strategies."""

    TOPIC = "topic"  # <topic>-key / <topic>-value (TopicNameStrategy, the default)
    RECORD = "record"  # the record's full name (RecordNameStrategy)
    TOPIC_RECORD = "topic_record"  # <topic>-<record full name> (TopicRecordNameStrategy)


ROLES = ("key", "value")


@dataclass(frozen=True)
class RegistryFormat:
    """A registry-framed format of the ``key`` or ``value`` column.

    :param schema: the schema's text; None derives it from the column, or reads it from the registry
        when ``version`` is given.
    :param version: use the subject's registered schema at this version (a number or ``"latest"``)
        instead of deriving one; nothing is registered.
    :param subject: the subject; None names it by ``subject_strategy``.
    :param subject_strategy: topic, record or topic_record.
    :param auto_register: register a schema the subject lacks (after the registry's compatibility
        check); False refuses instead, naming the subject.
    :param record_name: the derived schema's record name (Avro: ``namespace.Name``; JSON Schema: its
        ``title``); default ``<topic>_<role>`` made a valid name.
    """

    schema: str | None = None
    version: int | str | None = None
    subject: str | None = None
    subject_strategy: SubjectStrategy = SubjectStrategy.TOPIC
    auto_register: bool = True
    record_name: str | None = None

    schema_type: ClassVar[str] = ""  # the registry's schemaType

    def __post_init__(self) -> None:
        if self.schema is not None and self.version is not None:
            raise ValueError(f"{type(self).__name__}: give schema= or version=, not both")
        if isinstance(self.version, str) and self.version != "latest":
            raise ValueError(f"{type(self).__name__}: version must be a number or 'latest', not {self.version!r}")
        object.__setattr__(self, "subject_strategy", SubjectStrategy(self.subject_strategy))


@dataclass(frozen=True)
class AvroFormat(RegistryFormat):
    """Avro, encoded by spark-avro's ``to_avro``."""

    schema_type: ClassVar[str] = "AVRO"


@dataclass(frozen=True)
class JsonSchemaFormat(RegistryFormat):
    """JSON Schema, encoded by Spark's ``to_json``; the column must be a struct."""

    schema_type: ClassVar[str] = "JSON"


def subject_name(strategy: SubjectStrategy, topic: str | None, role: str, record_name: str | None) -> str:
    """The subject a schema goes under, by Confluent's strategy names."""
    if strategy is not SubjectStrategy.RECORD and not topic:
        raise ValueError(
            f"the {strategy.value!r} subject strategy needs the export's topic; with a 'topic' column, "
            "give the format a subject= or use subject_strategy='record'"
        )
    if strategy is SubjectStrategy.TOPIC:
        return f"{topic}-{role}"
    if not record_name:
        raise ValueError(f"the {strategy.value!r} subject strategy needs a record name, and the schema has none")
    return record_name if strategy is SubjectStrategy.RECORD else f"{topic}-{record_name}"


def default_record_name(topic: str | None, role: str) -> str:
    """A valid Avro name (letters, digits, underscores; not starting with a digit) for a derived schema."""
    raw = f"{topic or 'kafka2pc'}_{role}"
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in raw)
    return name if not name[0].isdigit() else f"_{name}"


__all__ = [
    "ROLES",
    "AvroFormat",
    "JsonSchemaFormat",
    "RegistryFormat",
    "SubjectStrategy",
    "default_record_name",
    "subject_name",
]
