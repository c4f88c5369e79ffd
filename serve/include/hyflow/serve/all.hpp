#pragma once
// hyflow::serve: the OpenAI-compatible rollout server (docs/rollout-server.md).

#include <hyflow/serve/api_error.hpp>
#include <hyflow/serve/engine_loop.hpp>
#include <hyflow/serve/openai_request.hpp>
#include <hyflow/serve/router.hpp>
#include <hyflow/serve/server.hpp>
#include <hyflow/serve/session_store.hpp>
#include <hyflow/serve/tool_call_parser.hpp>
