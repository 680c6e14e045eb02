#!/usr/bin/env bash
# Placeholder until the Kafka scripts land: fetch is a no-op.
exit 0
