"""Incremental text segmentation: streamed text in, speakable segments out."""

from realtime_engine.text.segmenter import (
    Segment,
    SegmenterConfig,
    SegmenterError,
    TextSegmenter,
)

__all__ = ["Segment", "SegmenterConfig", "SegmenterError", "TextSegmenter"]
