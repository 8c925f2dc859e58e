// Tolerant decoding (request_decoding.h) of the admin API's requests.
// ExpertMap is left out: it is also a response, which a client must see fail.
#pragma once

#include "proto/admin.pb.h"
#include "proto/cluster.pb.h"
#include "proto/request_decoding.h"

FLOTILLA_TOLERANT_REQUEST(flotilla::admin::GetStatusRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::admin::GetPlacementRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::admin::GetExpertMapRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::cluster::MeasureEngineRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::admin::ExpertLoadRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::admin::RebalanceRequest)
FLOTILLA_TOLERANT_REQUEST(flotilla::admin::DrainRequest)
