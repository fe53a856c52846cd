"""`OpenAIChatAgent`: the same multi-turn MCP episodes, answered by a model behind any OpenAI-compatible
chat-completions endpoint (vLLM, SGLang, `transformers serve`, a hosted API).

Each turn posts the episode's messages (the system prompt already lists the tools, so no `tools`
field is sent) and hands the reply's text to the env as a local model's; structured `tool_calls`
are written back as the `<tool_call>` blocks the model produced.

The server is not trusted: every request is one bounded exchange (`bounded_http`: one deadline,
`Endpoint.timeout_s`, and a capped body), read through pydantic models (`openai_schema`).

Failures, by who can fix them:
- 429, 408, 5xx and connection errors/timeouts are retried with exponential backoff (tenacity);
- a conversation the server rejects (400/413/422) becomes an empty turn, a format error, the HTTP
  error kept in the turn's `meta`;
- an answer no turn can be made of (a 5xx after the retries: `server_error`; over its cap:
  `too_large`; not a chat completion: `malformed`) ends the episode unscored, counted in
  `OpenAIChatAgent.protocol_errors`;
- what no turn can recover from (server gone, still rate-limited, bad key, unknown model) raises
  `EndpointError`, one `error:` line; `probe_endpoint` finds those before any episode runs.

Text only: no token ids (evaluation, not GRPO; docs/serving.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.env.chat_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from skyrl_tool_agent.policy.sampling_params import GREEDY, SamplingParams
from skyrl_tool_agent.rollout.bounded_http import (
    BoundedResponse,
    ResponseTooLarge,
    UndecodableResponse,
    bounded_request,
)
from skyrl_tool_agent.rollout.openai_schema import (
    MALFORMED,
    SERVER_ERROR,
    TOO_LARGE,
    AssistantMessage,
    ModelList,
    ProtocolError,
    ReplyLimits,
    parse_completion,
)
from skyrl_tool_agent.rollout.turns import Agent, AgentTurn, TurnRequest

logger = logging.getLogger(__name__)

#: Statuses worth another try: rate limit, request timeout, server errors (overload, model loading, ...).
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: Statuses that mean this conversation cannot be answered (the turn is a format error, the episode goes on).
TURN_STATUSES = frozenset({400, 413, 422})
#: Server errors still there after the retries: the turn cannot be had, the episode is unscored.
SERVER_STATUSES = RETRY_STATUSES - {408, 429}
#: What `OpenAIChatAgent.stats` counts (results.json's `endpoint` entry).
STATS = ("requests", "retries", "failed_turns", "prompt_tokens", "completion_tokens")
#: Longest wait between two attempts, seconds.
MAX_BACKOFF_S = 30.0


class EndpointError(UserInputError):
    """The endpoint cannot serve this evaluation (unreachable, wrong model, bad key, rate-limited)."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach the served model. `base_url`: the API root (a URL with no path gets
    `/v1`). `timeout_s`: one request's deadline, connect to the body's last byte. `max_retries` /
    `backoff_s`: retries of 429/408/5xx/connection errors, doubling the wait up to `MAX_BACKOFF_S`.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)  # never in logs or tracebacks
    timeout_s: float = 300.0
    max_retries: int = 4
    backoff_s: float = 1.0
    concurrency: int = 32

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise EndpointError(f"--base-url {self.base_url!r}: give an http(s) URL such as http://localhost:8000/v1")
        root = self.base_url.rstrip("/")
        object.__setattr__(self, "base_url", root if parts.path.strip("/") else root + "/v1")
        for name in ("timeout_s", "concurrency"):
            if getattr(self, name) <= 0:
                raise EndpointError(f"endpoint {name} must be > 0, got {getattr(self, name)}")
        if self.max_retries < 0 or self.backoff_s < 0:
            raise EndpointError("endpoint max_retries and backoff_s must be >= 0")

    @classmethod
    def from_env(cls, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", **kwargs: Any) -> Endpoint:
        """With the API key read from the environment variable `api_key_env` (unset: no key)."""
        return cls(base_url, model, api_key=os.environ.get(api_key_env) or None, **kwargs)

    def describe(self) -> dict[str, Any]:
        """For results.json (never the key)."""
        return {"base_url": self.base_url, "model": self.model, "timeout_s": self.timeout_s,
                "max_retries": self.max_retries, "backoff_s": self.backoff_s, "concurrency": self.concurrency}

    def client_kwargs(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {"headers": headers, "timeout": httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0))}


class _RetryableStatus(Exception):
    """An HTTP answer worth another try (tenacity retries on it)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}: {error_detail(response)}")
        self.response = response


def error_detail(response: BoundedResponse) -> str:
    """The server's own words about an error, whichever of the usual shapes it uses."""
    try:
        body = json.loads(response.content)
    except (ValueError, RecursionError):
        return " ".join(response.text[:2000].split())[:300] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        if error is not None:
            return " ".join(str(error).split())[:300]
    return json.dumps(body)[:300]


def message_text(message: AssistantMessage | dict[str, Any]) -> str:
    """An assistant message as the text the model wrote: structured `tool_calls` (from servers
    that parse them) back into `<tool_call>` blocks after the content, reasoning back into `<think>`.
    A dict is read as `AssistantMessage` (pydantic's ValidationError when it is not one)."""
    if not isinstance(message, AssistantMessage):
        message = AssistantMessage.model_validate(message)
    content = message.content or ""
    blocks = []
    for call in message.tool_calls or []:
        name, raw = call.function.name, call.function.arguments or "{}"
        try:  # serialised as format_tool_call does (the oracle's and the warm start's form)
            payload = json.dumps({"name": name, "arguments": json.loads(raw) if isinstance(raw, str) else raw},
                                 ensure_ascii=False)
        except (ValueError, RecursionError):  # keep what the model wrote: the env reports the bad JSON
            # (as it does for a local model's: absurdly deep nesting included)
            payload = f'{{"name": {json.dumps(name)}, "arguments": {raw}}}'
        blocks.append(f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}")
    text = "\n".join([content.rstrip(), *blocks]).strip("\n") if blocks else content
    reasoning = message.reasoning_content or message.reasoning
    return f"<think>\n{reasoning}\n</think>\n\n{text}" if reasoning else text


def probe_endpoint(endpoint: Endpoint) -> dict[str, Any]:
    """Check, before any episode, that `endpoint` answers chat completions for its model: lists
    `/models` and asks for one token as the episodes ask. Returns {"models": listed ids or None,
    "served_model", "model": the name to request (`transformers serve DIR` answers as `DIR@main`)};
    raises `EndpointError` (one line) otherwise. A success is remembered for the process. Each
    request goes over its own connection (a failed listing may close it)."""
    return dict(_probe(endpoint))


def _same_model(requested: str, name: str) -> bool:
    """Whether `requested` names the served `name`: the same, either with a `@revision`, or `name`'s last path part."""
    def bare(x: str) -> str:
        return x.rsplit("@", 1)[0] if "@" in x else x
    return bare(requested).rstrip("/") in (bare(name).rstrip("/"), bare(name).rstrip("/").rsplit("/", 1)[-1])


#: `transformers serve MODEL`'s answer to a request for another model (HTTP 400).
_PINNED = re.compile(r"Server is pinned to '(?P<name>[^']+)'")


@functools.lru_cache(maxsize=16)
def _probe(endpoint: Endpoint) -> dict[str, Any]:
    return asyncio.run(_probe_once(endpoint))  # the bounded reader is async; probes run before any loop


async def _fresh_request(endpoint: Endpoint, method: str, url: str, *, json: Any = None) -> BoundedResponse:
    """One bounded exchange over a new connection, with a 1-token answer's caps."""
    async with httpx.AsyncClient(**endpoint.client_kwargs()) as client:
        return await bounded_request(client, method, url, json=json, deadline_s=endpoint.timeout_s,
                                     max_bytes=ReplyLimits.for_turn(1).body_bytes)


async def _probe_once(endpoint: Endpoint) -> dict[str, Any]:
    url = endpoint.base_url
    try:  # its own connection: a failed listing may close it (see probe_endpoint)
        listing: BoundedResponse | None = await _fresh_request(endpoint, "GET", f"{url}/models")
    except httpx.TransportError as exc:
        raise EndpointError(f"cannot reach {url} ({type(exc).__name__}: {exc or 'no answer'}): is the "
                            "server running, and is --base-url its API root (e.g. http://localhost:8000/v1)?") from exc
    except (ResponseTooLarge, UndecodableResponse) as exc:  # no listing; the chat probe below decides
        logger.warning("%s/models: %s; the model's name is not checked against a listing", url, exc)
        listing = None
    if listing is not None and listing.status_code in (401, 403):
        raise EndpointError(f"{url}/models refused the API key (HTTP {listing.status_code}: {error_detail(listing)})")
    models = None
    if listing is not None and listing.status_code == 200:  # some servers cannot list (transformers serve lists only its hub cache)
        try:
            models = [card.id for card in ModelList.model_validate_json(listing.content).data]
        except ValidationError:
            models = None
    model = endpoint.model
    if models and model not in models:
        matches = [m for m in models if _same_model(model, m)]
        if len(matches) != 1:
            raise EndpointError(f"model {model!r} is not served at {url}; it serves: {', '.join(models)[:1000]}")
        model = matches[0]
    reply = await _chat_probe(endpoint, model)
    pinned = _PINNED.search(error_detail(reply)) if reply.status_code == 400 else None
    if pinned and _same_model(model, pinned["name"]):  # the name it reports, or the directory's name
        model = pinned["name"]
        reply = await _chat_probe(endpoint, model)
    if reply.status_code != 200:
        raise EndpointError(f"{url}/chat/completions answered HTTP {reply.status_code} for model "
                            f"{model!r}: {error_detail(reply)}")
    try:
        served = parse_completion(reply.content)
    except ProtocolError as exc:
        raise EndpointError(f"{url}/chat/completions did not answer in the chat-completions format "
                            f"({exc.detail})") from None
    if model != endpoint.model:
        logger.info("--model %r: the server serves it as %r", endpoint.model, model)
    return {"models": models, "served_model": served.model, "model": model}


async def _chat_probe(endpoint: Endpoint, model: str) -> BoundedResponse:
    """One 1-token chat completion for `model`, over a new connection."""
    url = endpoint.base_url
    body = _body(model, [{"role": "user", "content": "Hi"}], temperature=0.0, top_p=1.0, max_tokens=1)
    try:
        return await _fresh_request(endpoint, "POST", f"{url}/chat/completions", json=body)
    except httpx.TransportError as exc:
        raise EndpointError(f"{url}/chat/completions did not answer ({type(exc).__name__}: {exc})") from exc
    except (ResponseTooLarge, UndecodableResponse) as exc:
        raise EndpointError(f"{url}/chat/completions did not answer in the chat-completions format ({exc})") from exc


def _body(model: str, messages: Sequence[dict[str, Any]], *, temperature: float, top_p: float, max_tokens: int,
          seed: int | None = None) -> dict[str, Any]:
    # max_tokens (not max_completion_tokens): the one every OpenAI-compatible server accepts.
    body = {"model": model, "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "stream": False}
    if seed is not None:
        body["seed"] = seed
    return body


class OpenAIChatAgent(Agent):
    """An `Agent` whose turns come from `endpoint`'s chat completions (module docstring), sampled
    with `params` and each request's `max_new_tokens`; a sampled request carries a seed from
    `seed`, the episode and the turn. `summary()`: `stats` and `protocol_errors`, for results.json.
    """

    def __init__(self, endpoint: Endpoint, params: SamplingParams = GREEDY, *, seed: int = 0) -> None:
        self.endpoint = endpoint
        self.params = params
        self.seed = seed
        self.stats: Counter[str] = Counter(dict.fromkeys(STATS, 0))
        self.protocol_errors: Counter[str] = Counter()
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The client and request slots of the running event loop (each `asyncio.run` gets its own)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = httpx.AsyncClient(**self.endpoint.client_kwargs())
            self._slots = asyncio.Semaphore(self.endpoint.concurrency)
            self._loop = loop
        assert self._slots is not None
        return self._client, self._slots

    def summary(self) -> dict[str, Any]:
        """`stats`, and `protocol_errors` by reason (results.json's `endpoint` entry)."""
        return {**self.stats, "protocol_errors": dict(sorted(self.protocol_errors.items()))}

    async def aclose(self) -> None:
        """Close the HTTP client (call from the loop that used it)."""
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = self._loop = self._slots = None

    async def act(self, requests: Sequence[TurnRequest]) -> list[AgentTurn]:
        return list(await asyncio.gather(*(self._turn(r) for r in requests)))

    async def _turn(self, request: TurnRequest) -> AgentTurn:
        client, slots = self._session()
        seed = None if self.params.greedy else (self.seed * 1_000_003 + request.seq * 1_009 + request.turn) % 2**31
        body = _body(self.endpoint.model, request.messages, temperature=self.params.temperature, top_p=self.params.top_p,
                     max_tokens=request.max_new_tokens, seed=seed)
        url = f"{self.endpoint.base_url}/chat/completions"
        limits = ReplyLimits.for_turn(request.max_new_tokens)
        attempts = 0

        async def post() -> BoundedResponse:
            nonlocal attempts
            attempts += 1
            self.stats["requests"] += 1
            send = functools.partial(bounded_request, method="POST", url=url, json=body,
                                     deadline_s=self.endpoint.timeout_s, max_bytes=limits.body_bytes)
            async with slots:
                if attempts == 1:
                    response = await send(client)
                else:  # a retry goes over a new connection: after an error the server may drop the pooled one
                    # (uvicorn closes it after an unhandled exception, just after sending the 500)
                    async with httpx.AsyncClient(**self.endpoint.client_kwargs()) as fresh:
                        response = await send(fresh)
            if response.status_code in RETRY_STATUSES:
                raise _RetryableStatus(response)
            return response

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((_RetryableStatus, httpx.TransportError)), reraise=True,
                before_sleep=self._count_retry,
                stop=stop_after_attempt(self.endpoint.max_retries + 1),
                wait=wait_exponential(multiplier=self.endpoint.backoff_s, max=MAX_BACKOFF_S),
            ):
                with attempt:
                    response = await post()
        except _RetryableStatus as exc:
            response = exc.response
        except httpx.TransportError as exc:
            raise EndpointError(f"{url} stopped answering ({type(exc).__name__}: {exc or 'no answer'}) after "
                                f"{attempts} attempts; is the server up? (a slow model may need a longer --request-timeout)") from exc
        except ResponseTooLarge as exc:
            return self._unscored_turn(ProtocolError(TOO_LARGE, str(exc)), attempts)
        except UndecodableResponse as exc:
            return self._unscored_turn(ProtocolError(MALFORMED, str(exc)), attempts)
        return self._reply(request, response, attempts, limits)

    def _count_retry(self, state: RetryCallState) -> None:
        self.stats["retries"] += 1
        exc = state.outcome.exception() if state.outcome else None
        logger.info("retrying %s in %.1f s (attempt %d): %s", self.endpoint.base_url, state.upcoming_sleep,
                    state.attempt_number, exc)

    def _reply(self, request: TurnRequest, response: BoundedResponse, attempts: int, limits: ReplyLimits) -> AgentTurn:
        status = response.status_code
        if status == 200:
            try:
                completion = parse_completion(response.content)
                choice = completion.choices[0]
                text = message_text(choice.message)
                if len(text) > limits.turn_chars:
                    raise ProtocolError(TOO_LARGE, f"a turn of {len(text)} characters, over the cap of "
                                                   f"{limits.turn_chars} for max_tokens={request.max_new_tokens}")
            except ProtocolError as exc:
                return self._unscored_turn(exc, attempts)
            if completion.usage is not None:
                self.stats["prompt_tokens"] += completion.usage.prompt_tokens or 0
                self.stats["completion_tokens"] += completion.usage.completion_tokens or 0
            meta = {"attempts": attempts} if attempts > 1 else {}
            return AgentTurn(text=text, meta=meta)
        if status in TURN_STATUSES:
            return self._failed_turn(request, f"HTTP {status}: {error_detail(response)}", attempts)
        if status in SERVER_STATUSES:
            return self._unscored_turn(ProtocolError(SERVER_ERROR, f"HTTP {status}: {error_detail(response)}"), attempts)
        if status == 429:
            raise EndpointError(f"{self.endpoint.base_url} still rate-limits after {attempts} attempts "
                                f"({error_detail(response)}): lower --concurrency or raise --max-retries")
        hint = " (check the API key)" if status in (401, 403) else ""
        raise EndpointError(f"{self.endpoint.base_url} answered HTTP {status} for model {self.endpoint.model!r}: "
                            f"{error_detail(response)}{hint}")

    def _failed_turn(self, request: TurnRequest, error: str, attempts: int) -> AgentTurn:
        """A conversation the server would not answer: empty text, which the env answers with a format error."""
        self.stats["failed_turns"] += 1
        logger.warning("episode %s/%d turn %d: %s after %d attempt(s); the turn counts as a format error",
                       request.task.task_id, request.group_index, request.turn, error, attempts)
        return AgentTurn(text="", meta={"endpoint_error": error, "attempts": attempts})

    def _unscored_turn(self, error: ProtocolError, attempts: int) -> AgentTurn:
        """An answer no turn can be made of: the collector ends the episode unscored (and logs it, once)."""
        self.stats["failed_turns"] += 1
        self.protocol_errors[error.reason] += 1
        return AgentTurn(text="", meta={"endpoint_error": error.detail, "attempts": attempts},
                         infra_error=f"served model, {error} (after {attempts} attempt(s))")
