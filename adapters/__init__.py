"""adapters package: the channels (web, Slack, email) and the kit they are built with.

The gateway reaches channels only through what this module exports: the channel contract
(`ChannelAdapter` and the messages it exchanges), the kit (`ChannelSpec`, `ChannelContext`) and
the registry (`channel_specs`). A channel's own folder is imported by its spec's builder, never
by the gateway.
"""

from adapters.channel import (
    Acceptance,
    AdapterStartError,
    ApprovalClosed,
    ApprovalView,
    Attachment,
    Author,
    AuthorityChange,
    Capabilities,
    ChannelAdapter,
    ContextMessage,
    DecisionInbound,
    DecisionItem,
    DecisionRefused,
    DeliveryError,
    DeliveryReceipt,
    FileRefused,
    GivesUp,
    Inbound,
    InboundSink,
    IncomingFile,
    KnownThread,
    NotRouted,
    Outbound,
    OutboundKind,
    PendingCall,
    Reconciled,
    TextCut,
    ThreadRef,
    Unavailable,
    is_copy_of,
    result_line,
)
from adapters.errors import AdapterError
from adapters.files import (
    FileKind,
    FileLimits,
    file_kind,
    image_format,
    image_refusal,
    take_in,
)
from adapters.json_bodies import read_json, text_problem
from adapters.kit import ChannelContext, ChannelSpec
from adapters.live import LiveKind, LiveUpdate, LiveView, shared_prefix
from adapters.numbers import whole_number
from adapters.registry import (
    BUILT_IN,
    ENTRY_POINT_GROUP,
    RegistryError,
    channel_sections,
    channel_specs,
)
from adapters.store_full import STORE_FULL, store_full

__all__ = [
    "Acceptance",
    "AdapterError",
    "AdapterStartError",
    "ApprovalClosed",
    "ApprovalView",
    "Attachment",
    "Author",
    "AuthorityChange",
    "BUILT_IN",
    "Capabilities",
    "channel_sections",
    "channel_specs",
    "ChannelAdapter",
    "ChannelContext",
    "ChannelSpec",
    "ContextMessage",
    "DecisionInbound",
    "DecisionItem",
    "DecisionRefused",
    "DeliveryError",
    "DeliveryReceipt",
    "ENTRY_POINT_GROUP",
    "file_kind",
    "FileKind",
    "FileLimits",
    "FileRefused",
    "GivesUp",
    "image_format",
    "image_refusal",
    "Inbound",
    "InboundSink",
    "IncomingFile",
    "is_copy_of",
    "KnownThread",
    "LiveKind",
    "LiveUpdate",
    "LiveView",
    "NotRouted",
    "Outbound",
    "OutboundKind",
    "PendingCall",
    "read_json",
    "Reconciled",
    "RegistryError",
    "result_line",
    "shared_prefix",
    "store_full",
    "STORE_FULL",
    "take_in",
    "text_problem",
    "TextCut",
    "ThreadRef",
    "Unavailable",
    "whole_number",
]
