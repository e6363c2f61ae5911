"""Workload specifications: what a workload actor replays, as strict typed configs.

A *session* is one agent conversation; a *turn* is one request inside it, whose
prompt is the session's whole accumulated context. Variants are discriminated on
``kind`` so a sweep YAML names exactly one loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenRange(_Strict):
    """A token count drawn uniformly (seeded) from ``[min, max]``."""

    min: int = Field(ge=1, le=1_000_000, description="Smallest token count.")
    max: int = Field(ge=1, le=1_000_000, description="Largest token count.")

    @model_validator(mode="after")
    def _ordered(self) -> TokenRange:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class ToolSchema(_Strict):
    """One tool's argument schema: an answer constrained by it is a JSON object of this tool's arguments."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The tool's name (the json_schema's name).")
    parameters: dict[str, Any] = Field(description="JSON Schema of the tool's arguments: an object schema.")

    @model_validator(mode="after")
    def _object(self) -> ToolSchema:
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be an object schema (type: object), "
                             f"got type {self.parameters.get('type')!r}")
        return self


class StructuredOutput(_Strict):
    """Answers constrained by a JSON schema, as agent frameworks ask for a tool call's arguments.

    Each constrained turn sends ``response_format: {type: json_schema, json_schema: {name, schema, strict:
    true}}`` with one tool's argument schema, drawn (seeded, per session and turn) from ``tools``. The
    server compiles a grammar per schema (its structured-output threads, sized from the host's cores,
    not the replica's) and masks every decode step with it.

    Such a turn sends no ``min_tokens`` or ``ignore_eos``: forcing the length would forbid the end of
    sequence once the grammar has closed its object, and leave no token the grammar allows. The answer
    ends where the grammar and ``max_tokens`` (the turn's output count) let it, and records keep the
    tokens it had (``completion_tokens``) and the schema's name (``response_schema``)."""

    tools: Literal["coding-agent"] | tuple[ToolSchema, ...] = Field(
        default="coding-agent",
        description="'coding-agent': the nine tools of workloads/schemas/coding-agent.json (shell, file editor, "
                    "read, grep, list, tests, web fetch, think, finish), or a list of {name, parameters}.")
    fraction: float = Field(default=1.0, gt=0, le=1,
                            description="Share of turns constrained (seeded per session and turn); the rest are "
                                        "free text with their forced length.")

    @field_validator("tools")
    @classmethod
    def _some_unique(cls, v: Any) -> Any:
        if isinstance(v, tuple):
            names = [t.name for t in v]
            if not names:
                raise ValueError("give at least one tool, or 'coding-agent'")
            if len(set(names)) != len(names):
                raise ValueError(f"tool names must be unique, got {names}")
        return v


class _WorkloadBase(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                      description="Short name, used in trial ids and tables.")
    request_timeout_s: float = Field(default=60.0, gt=0, le=3600,
                                     description="Deadline per request; a request past it is a timeout.")
    max_duration_s: float = Field(default=600.0, gt=0, le=86_400,
                                  description="Measurement window; work not sent by then is cut cleanly.")
    seed: int = Field(default=0, ge=0, description="Seed for every random choice of the workload.")
    drain_s: float | None = Field(
        default=None, ge=0, le=3600,
        description="After the window, in-flight requests get this long before they are cut (status 'cut'); "
                    "None lets each run to its own request deadline.")
    client_tokenize: Literal["off", "after", "inflight"] = Field(
        default="after",
        description="Tokenize each sent prompt on the client to record its token count and tokenization time: "
                    "'after' the window (no interference with the load; keeps prompts in memory until then), "
                    "'inflight' in a worker thread while the request runs (competes with the client for its "
                    "cores), or 'off'.")
    structured_output: StructuredOutput | None = Field(
        default=None,
        description="Constrain answers to tools' argument schemas (response_format json_schema); None: free text.")

    @model_serializer(mode="wrap")
    def _omit_free_text(self, handler: Any) -> dict[str, Any]:
        # Left out when unset, so that a workload written before the field existed keeps its trial ids.
        out: dict[str, Any] = handler(self)
        if self.structured_output is None:
            out.pop("structured_output", None)
        return out


TextStyle = Literal["agent-mix", "code", "prose", "json", "uniform"]


class _SyntheticText(_WorkloadBase):
    text_style: TextStyle = Field(
        default="agent-mix",
        description="What the generated prompt text looks like, which sets its tokenization cost per token: "
                    "'agent-mix' (code, JSON tool output and prose, like a coding agent's context; the default), "
                    "'code', 'prose', 'json', or 'uniform' (random single-token words: costlier to tokenize "
                    "than real text; kept for comparison with earlier results).")


class AgenticWorkload(_SyntheticText):
    """Synthetic agentic sessions: shared tool prefix, growing context, real answers appended."""

    kind: Literal["agentic"] = "agentic"
    sessions: int = Field(ge=1, le=100_000, description="Number of sessions (conversations).")
    concurrency: int = Field(default=1, ge=1, le=10_000,
                             description="Sessions in flight at once (closed loop).")
    session_rate_per_s: float | None = Field(
        default=None, gt=0, description="Poisson arrival rate of new sessions; None starts them as slots free.")
    turns: int = Field(ge=1, le=1000, description="Turns (requests) per session.")
    system_prompt_tokens: int = Field(default=1024, ge=0, le=1_000_000,
                                      description="Shared system/tool prefix, identical across sessions.")
    task_tokens: TokenRange = Field(default=TokenRange(min=64, max=256),
                                    description="Per-session task description appended after the prefix.")
    tool_output_tokens: TokenRange = Field(default=TokenRange(min=200, max=2000),
                                           description="Tool output appended before each later turn.")
    output_tokens: TokenRange = Field(default=TokenRange(min=32, max=128),
                                      description="Tokens the model is asked to generate per turn.")
    max_context_tokens: int = Field(default=32_768, ge=64, le=2_000_000,
                                    description="A session ends once its context would exceed this.")
    think_time_s: float = Field(default=0.0, ge=0, le=3600, description="Pause between a reply and the next turn.")


class MooncakeWorkload(_SyntheticText):
    """Replay of a Mooncake trace (timestamp ms, input_length, output_length, hash_ids of 512-token blocks)."""

    kind: Literal["mooncake"] = "mooncake"
    path: Path = Field(description="JSONL trace file.")
    max_requests: int | None = Field(default=None, ge=1, description="Replay at most this many lines.")
    max_in_flight: int = Field(default=1024, ge=1, le=100_000,
                               description="Most requests in flight at once; later arrivals wait, as dispatch lag.")
    time_scale: float = Field(default=1.0, gt=0, description="Multiply trace gaps by this (0.5 = twice as fast).")
    block_tokens: int = Field(default=512, ge=1, description="Tokens per hash id block.")
    max_context_tokens: int | None = Field(default=None, ge=64,
                                           description="Clip prompts to this many tokens (keeps the prefix).")


class AzureWorkload(_SyntheticText):
    """Replay of an Azure LLM inference 2023 trace (TIMESTAMP, ContextTokens, GeneratedTokens)."""

    kind: Literal["azure"] = "azure"
    path: Path = Field(description="CSV trace file.")
    max_requests: int | None = Field(default=None, ge=1, description="Replay at most this many rows.")
    max_in_flight: int = Field(default=1024, ge=1, le=100_000,
                               description="Most requests in flight at once; later arrivals wait, as dispatch lag.")
    time_scale: float = Field(default=1.0, gt=0, description="Multiply trace gaps by this.")
    max_context_tokens: int | None = Field(default=None, ge=64, description="Clip prompts to this many tokens.")


class RecordedWorkload(_WorkloadBase):
    """Replay of recorded agent sessions, real text included, through the chat endpoint.

    Files are ``abench-session-jsonl-v1`` (agentic-bench: ``system_prompt`` and ``turns`` with
    ``input_delta``, ``assistant_text`` and token counts) or plain chat JSONL (``messages``),
    optionally zstd-compressed; see ``workloads.loaders.recorded``. No text is synthesised, so
    there is no ``text_style``: the prompts tokenize exactly like the agent's real context.
    """

    kind: Literal["recorded"] = Field(default="recorded", description="Selects this workload kind.")
    path: Path = Field(description="Session file (.jsonl or .jsonl.zst), relative to the sweep file.")
    format: Literal["auto", "abench", "chat"] = Field(
        default="auto", description="'abench' (abench-session-jsonl-v1), 'chat' ({'messages': [...]} per line), "
                                    "or 'auto': detected from the file's first session.")
    mode: Literal["trace", "live"] = Field(
        default="trace",
        description="'trace': later turns carry the recorded assistant_text in their history (prompts are "
                    "exactly the recorded ones; the server's answer is discarded); 'live': they carry the "
                    "server's own answer, like the agentic kind.")
    max_sessions: int | None = Field(default=None, ge=1, description="Replay at most this many sessions (file order).")
    concurrency: int = Field(default=1, ge=1, le=10_000, description="Sessions in flight at once (closed loop).")
    session_rate_per_s: float | None = Field(
        default=None, gt=0, description="Poisson arrival rate of new sessions; None starts them as slots free.")
    gaps: Literal["keep", "scale", "drop"] = Field(
        default="keep", description="Recorded tool/think gaps (pre_gap_ms) before each turn: kept as recorded, "
                                    "multiplied by gap_scale, or dropped (0).")
    gap_scale: float = Field(default=1.0, gt=0, le=1000, description="Multiplier of the gaps when gaps='scale'.")
    max_context_tokens: int | None = Field(
        default=None, ge=64, le=2_000_000,
        description="A session ends before the first turn whose prompt would exceed this many tokens, by the "
                    "recorded input_tokens where present, else by an estimate of 4 characters per token.")
    output_tokens: Literal["recorded", "fixed"] = Field(
        default="recorded", description="Tokens forced per answer (min_tokens, ignore_eos): each turn's recorded "
                                        "output_tokens, or fixed_output_tokens for every turn.")
    fixed_output_tokens: int = Field(default=128, ge=1, le=1_000_000,
                                     description="Tokens per answer when output_tokens='fixed'.")

    @model_validator(mode="after")
    def _scale_only_when_scaling(self) -> RecordedWorkload:
        if self.gaps != "scale" and self.gap_scale != 1.0:
            raise ValueError(f"gap_scale {self.gap_scale} has no effect unless gaps='scale' (gaps={self.gaps!r})")
        return self


WorkloadSpec = Annotated[AgenticWorkload | MooncakeWorkload | AzureWorkload | RecordedWorkload,
                         Field(discriminator="kind")]

__all__ = ["AgenticWorkload", "AzureWorkload", "MooncakeWorkload", "RecordedWorkload", "StructuredOutput", "TextStyle",
           "TokenRange", "ToolSchema", "WorkloadSpec"]
