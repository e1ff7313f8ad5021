// A world's trace written to files: JSON lines and Chrome's format (sim/trace.h makes the texts),
// all or nothing through npy::OutputFiles. Used by the C API's simulator calls and by the
// `exactcoll sim` commands (tools/sim/sim_flags.h, which writes them with the command's outputs).
#pragma once

#include <string>

#include "npy/npy.h"
#include "sim/world.h"

namespace exactcoll::sim {

// Writes world's trace as JSON lines to json_path and in Chrome's format to chrome_path into
// `files`, which reserved them (an empty path skips it). Nothing is written when the world was not
// traced. Throws npy::NpyError on an I/O failure.
void write_trace_texts(const World& world, const std::string& json_path, const std::string& chrome_path,
                       npy::OutputFiles& files);

// Writes world's trace as JSON lines to json_path and in Chrome's format to chrome_path (both or
// neither, through npy::OutputFiles; an empty path skips it; paths as given, not resolved).
// Returns "" or the error.
// Nothing is written when the world was not traced.
std::string write_trace_files(const World& world, const std::string& json_path, const std::string& chrome_path);

}  // namespace exactcoll::sim
