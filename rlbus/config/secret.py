"""Settings that must not print: a password, a token, a URL that may carry a password.

They are strings, so the code that uses them (a client's password argument, a DSN) takes them
as they are, and `model_dump` hands them to child processes whole. Every way of printing one
(str(), repr(), f-strings, %-formatting, rich, logging, pydantic errors that show the value)
shows it masked; `reveal()` is the only spelling of the value itself.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

MASK = "**********"


class Secret(str):
    """A string printed as MASK (an empty one as '')."""

    def reveal(self) -> str:
        return str.__str__(self)  # a plain str copy of the value

    def masked(self) -> str:
        return MASK if self.reveal() else ""

    def __str__(self) -> str:
        return self.masked()

    def __repr__(self) -> str:
        return repr(self.masked())

    def __format__(self, spec: str) -> str:
        return format(self.masked(), spec)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value: str.__str__(value)
            ),
        )


class SecretUrl(Secret):
    """A URL printed with its password (in user:password@ or a `password` parameter)
    masked; the rest of it shows."""

    def masked(self) -> str:
        value = self.reveal()
        try:
            parts = urlsplit(value)
            netloc = parts.netloc
            if parts.password is not None:
                user = parts.username or ""
                host = netloc.rpartition("@")[2]
                netloc = f"{user}:{MASK}@{host}"
            query = parts.query
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(k.lower() == "password" for k, _ in pairs):
                masked = [(k, MASK if k.lower() == "password" else v) for k, v in pairs]
                query = urlencode(masked, safe="*")
            if (netloc, query) == (parts.netloc, parts.query):
                return value  # nothing secret in it: shown as written
            return urlunsplit(parts._replace(netloc=netloc, query=query))
        except ValueError:  # not a URL a parser accepts: show nothing of it
            return MASK
