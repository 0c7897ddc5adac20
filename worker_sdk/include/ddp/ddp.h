// The worker SDK in one include: ddp::Init, ProcessGroup, Work, Reducer, ddp::metrics,
// ddp::checkpoint.
#pragma once

#include "ddp/checkpoint.h"
#include "ddp/error.h"
#include "ddp/metrics.h"
#include "ddp/process_group.h"
#include "ddp/reducer.h"
#include "ddp/types.h"
