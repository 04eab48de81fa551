#pragma once
// Builds the model named by [model] for the data it will see (channels, image size, classes or
// vocabulary come from the data, not the config).

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "models/model.h"

#include <memory>

namespace ht {

// Throws UserError when the model and the data do not fit together.
std::shared_ptr<Model> make_model(const Config& config, const DataInfo& data);

}  // namespace ht
