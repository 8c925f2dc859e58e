// Tolerant decoding (request_decoding.h) of the client API's requests.
#pragma once

#include "proto/flotilla.pb.h"
#include "proto/request_decoding.h"

FLOTILLA_TOLERANT_REQUEST(flotilla::v1::GenerateRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::v1::ChatRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::v1::CancelRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::v1::ListModelsRequest)
